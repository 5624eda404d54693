"""A counting env whose steps wait while a gate file exists, and a policy that marks its weight.

Each env steps `free_steps` times freely, then waits at every step while the gate exists: a test
that creates the file first holds every worker in its second batch, for as long as it needs,
then opens the gate; a worker writes `blocked-<pid>` beside the gate when it first waits, so the
test knows when the workers are held.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from tensordict.nn import TensorDictModule
from torch import nn

from rlcollect.testing import CountingEnv


class GatedCountingEnv(CountingEnv):
    """A counting env whose steps after the first `free_steps` wait while `gate` exists."""

    def __init__(self, gate: str, free_steps: int) -> None:
        super().__init__(episode_length=1000)
        self.gate = Path(gate)
        self.free_steps = free_steps

    def step_into(self, t: int) -> None:
        self.free_steps -= 1
        if self.free_steps < 0 and self.gate.exists():
            (self.gate.parent / f"blocked-{os.getpid()}").touch()
            while self.gate.exists():
                time.sleep(0.01)
        super().step_into(t)


class MarkPolicy(nn.Module):
    """Action 0; writes its one weight as `"mark"`, so a batch tells which weights ran it."""

    def __init__(self, mark: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor(mark))

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch = observation.shape[:-1]
        action = torch.zeros(batch, dtype=torch.int64)
        return action, self.weight.detach().expand(*batch, 1).clone()


def mark_policy(mark: float = 0.0) -> TensorDictModule:
    return TensorDictModule(MarkPolicy(mark), in_keys=["observation"], out_keys=["action", "mark"])


def counting_env_after_gate(gate: str) -> CountingEnv:
    """A counting env built once `gate` no longer exists (a worker slow to start)."""
    while Path(gate).exists():
        time.sleep(0.01)
    return CountingEnv(episode_length=5)


def broken_env_maker() -> CountingEnv:
    raise OSError("no display")

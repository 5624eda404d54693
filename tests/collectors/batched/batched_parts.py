"""Envs and policies for the AsyncBatchedCollector tests: every answer can be checked against
the observation it was asked about, so an answer routed to the wrong worker shows."""

from __future__ import annotations

import threading
import time

import torch
from tensordict.nn import TensorDictModule
from tensordict.nn.probabilistic import interaction_type
from torch import nn

from rlcollect.testing.counting import CountingEnv

# Episode lengths of the workers' envs: each worker's observations run their own course.
LENGTHS = (3, 4, 5, 7)


def counting_env(length: int) -> CountingEnv:
    return CountingEnv(episode_length=length)


class EchoPolicy(nn.Module):
    """Action 0; `"echo"` = 10 * observation + bias, so a frame tells which weights and which
    observation produced its answer. Raises when the observation reaches `fail_at`."""

    def __init__(self, bias: float = 0.0, fail_at: float | None = None) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.tensor(float(bias)))
        self.fail_at = fail_at

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fail_at is not None and bool((observation >= self.fail_at).any()):
            raise ValueError(f"the policy broke at observation {self.fail_at}")
        action = torch.zeros(observation.shape[:-1], dtype=torch.int64)
        return action, observation * 10.0 + self.bias


def echo_module(bias: float = 0.0, fail_at: float | None = None) -> TensorDictModule:
    return TensorDictModule(
        EchoPolicy(bias, fail_at), in_keys=["observation"], out_keys=["action", "echo"]
    )


class OverlapRecord:
    """What `SlowEchoPolicy` forwards saw, in this process: how many ran at once at most, and
    any that found the interaction type changed under it."""

    lock = threading.Lock()
    running = 0
    most_at_once = 0
    changed: list[str] = []

    @classmethod
    def reset(cls) -> None:
        cls.running, cls.most_at_once, cls.changed = 0, 0, []


class SlowEchoPolicy(EchoPolicy):
    """`EchoPolicy` whose forward sleeps (releasing the GIL, as a conv does) and records in
    `OverlapRecord` how many forwards overlap and whether the interaction type held."""

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with OverlapRecord.lock:
            OverlapRecord.running += 1
            OverlapRecord.most_at_once = max(OverlapRecord.most_at_once, OverlapRecord.running)
        before = interaction_type()
        time.sleep(0.004)
        after = interaction_type()
        if before != after:
            OverlapRecord.changed.append(f"{before} -> {after}")
        with OverlapRecord.lock:
            OverlapRecord.running -= 1
        return super().forward(observation)


def slow_echo_module(bias: float = 0.0) -> TensorDictModule:
    return TensorDictModule(
        SlowEchoPolicy(bias), in_keys=["observation"], out_keys=["action", "echo"]
    )

"""Envs and policies for the AsyncBatchedCollector tests: every answer can be checked against
the observation it was asked about, so an answer routed to the wrong worker shows."""

from __future__ import annotations

import torch
from tensordict.nn import TensorDictModule
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

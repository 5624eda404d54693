"""TorchRL's Pendulum, and a policy factory that records which processes built its policy."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

pytest.importorskip("torchrl.envs")  # pendulum is TorchRL's env


def pendulum() -> Any:
    from torchrl.envs import GymEnv

    return GymEnv("Pendulum-v1")


class RecordingFactory:
    """Builds the policy (action = bias, whatever the observation) and appends the pid of the
    process that called it to a file."""

    def __init__(self, record: Path, bias: float = 0.25) -> None:
        self.record, self.bias = record, bias

    def __call__(self) -> TensorDictModule:
        with self.record.open("a") as handle:
            handle.write(f"{os.getpid()}\n")
        return policy_with_bias(self.bias)

    def pids(self) -> list[int]:
        return [int(line) for line in self.record.read_text().split()]


def policy_with_bias(bias: float) -> TensorDictModule:
    linear = nn.Linear(3, 1)
    with torch.no_grad():
        linear.weight.zero_()
        linear.bias.fill_(bias)
    return TensorDictModule(linear, in_keys=["observation"], out_keys=["action"])

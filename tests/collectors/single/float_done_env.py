"""A TorchRL env whose done flags are float32, not boolean (`FloatDoneEnv`)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

torchrl_envs = pytest.importorskip("torchrl.envs")
torchrl_data = pytest.importorskip("torchrl.data")


class FloatDoneEnv(torchrl_envs.EnvBase):
    """A TorchRL env whose done and terminated flags are float32 (as in TorchRL's tests):
    observation counts the steps, episodes last `length` steps."""

    def __init__(self, length: int = 3) -> None:
        super().__init__(batch_size=())
        self.length = length
        self.observation_spec = torchrl_data.Composite(observation=torchrl_data.Unbounded((1,)))
        self.action_spec = torchrl_data.Unbounded((1,))
        self.reward_spec = torchrl_data.Unbounded((1,))
        flag = torchrl_data.Unbounded((1,), dtype=torch.float32)
        self.full_done_spec = torchrl_data.Composite(done=flag, terminated=flag.clone())
        self.count = 0

    def _reset(self, tensordict: TensorDictBase | None) -> TensorDictBase:
        self.count = 0
        zero = torch.zeros(1)
        return TensorDict(observation=zero, done=zero.clone(), terminated=zero.clone())

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self.count += 1
        done = torch.tensor([float(self.count >= self.length)])
        return TensorDict(
            observation=torch.tensor([float(self.count)]),
            reward=torch.ones(1),
            done=done,
            terminated=done.clone(),
        )

    def _set_seed(self, seed: int | None) -> None:
        return None

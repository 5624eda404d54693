"""Deterministic policies (and a two-observation env) for collector tests."""

from __future__ import annotations

import time

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

from rlcollect import keys
from rlcollect.envs.base import EnvBase
from rlcollect.envs.specs import Categorical, Composite, Unbounded


class GreedyPolicy(nn.Module):
    """A fixed linear scorer whose arg-max is taken as a one-hot action: deterministic."""

    def __init__(self, observation_size: int = 4, actions: int = 2, seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.linear = nn.Linear(observation_size, actions)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(actions, observation_size, generator=generator))
            self.linear.bias.zero_()
        self.actions = actions

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        scores = self.linear(observation)
        return nn.functional.one_hot(scores.argmax(-1), self.actions)


def greedy_module(seed: int = 0) -> TensorDictModule:
    """The greedy CartPole policy as a TensorDict module."""
    return TensorDictModule(GreedyPolicy(seed=seed), in_keys=["observation"], out_keys=["action"])


class TwoObservationEnv(EnvBase):
    """A single env observing `"position"` `[2]` (always -1) and `"speed"` `[3]` (always +1).

    Its episodes never end and its action (`Categorical(2)`) changes nothing: it exists to
    check that a plain module's forward arguments are matched to observation keys by name.
    """

    def __init__(self) -> None:
        super().__init__()
        self.observation_spec = Composite(
            position=Unbounded(shape=(2,)), speed=Unbounded(shape=(3,))
        )
        self.action_spec = Categorical(2)
        self.reward_spec = Unbounded(shape=(1,))
        flag = Categorical(2, shape=(1,), dtype=torch.bool)
        self.done_spec = Composite(dict.fromkeys(keys.DONE_KEYS, flag))

    def _observation(self) -> TensorDict:
        flags = {name: torch.zeros(1, dtype=torch.bool) for name in keys.DONE_KEYS}
        return TensorDict({"position": -torch.ones(2), "speed": torch.ones(3), **flags})

    def _reset(self, tensordict: TensorDictBase | None) -> TensorDictBase:
        return self._observation()

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._observation().set(keys.REWARD, torch.zeros(1))

    def _set_seed(self, seed: int) -> int:
        return seed + 1


class BiasPolicy(nn.Module):
    """Acts with its learnable bias whatever it observes: batches show which weights ran.

    Loading a bias of `HANG_BIAS` never returns (a worker that stops answering an update).
    """

    HANG_BIAS = 99.0

    def __init__(self, bias: float = 0.5, action_size: int = 1) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.full((action_size,), bias))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.bias.expand(*observation.shape[:-1], self.bias.shape[0]).clone()

    def _load_from_state_dict(self, state_dict, prefix, *args) -> None:
        if float(state_dict[prefix + "bias"][0]) == self.HANG_BIAS:
            time.sleep(3600)
        super()._load_from_state_dict(state_dict, prefix, *args)


def bias_module(bias: float = 0.5) -> TensorDictModule:
    """`BiasPolicy` for Pendulum (one action) as a TensorDict module."""
    return TensorDictModule(BiasPolicy(bias), in_keys=["observation"], out_keys=["action"])

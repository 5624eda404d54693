"""Deterministic policies (and a two-observation env) for collector tests."""

from __future__ import annotations

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

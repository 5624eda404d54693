"""Deterministic policies for collector tests."""

from __future__ import annotations

import torch
from tensordict.nn import TensorDictModule
from torch import nn


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

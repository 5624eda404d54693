"""simple_tag's predator and prey teams (`tag`, `team_of`), and a seeded `Greedy` policy."""

from __future__ import annotations

import pytest
import torch

from rlcollect.envs.pettingzoo_env import PettingZooEnv

pytest.importorskip("mpe2")
from mpe2 import simple_tag_v3


class Greedy(torch.nn.Module):
    """Argmax of a seeded linear map of each agent's observation; counts its calls."""

    def __init__(self, observation_size: int, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = torch.nn.Linear(observation_size, 5)
        self.calls = 0

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.net(observation).argmax(-1)


def team_of(agent_id: str) -> str:
    return "predator" if agent_id.startswith("adversary") else "prey"


def tag(seed: int = 0, max_cycles: int = 10) -> PettingZooEnv:
    env = simple_tag_v3.parallel_env(max_cycles=max_cycles, continuous_actions=False)
    return PettingZooEnv(env, seed=seed)

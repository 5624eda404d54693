"""mpe2's simple_spread as a PettingZooEnv (`spread_env`), and a greedy policy over a group."""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule

from rlcollect.envs.pettingzoo_env import PettingZooEnv

pytest.importorskip("mpe2")
from mpe2 import simple_spread_v3


def spread(max_cycles: int = 10) -> object:
    return simple_spread_v3.parallel_env(N=3, continuous_actions=False, max_cycles=max_cycles)


def spread_env(seed: int = 0, max_cycles: int = 10) -> PettingZooEnv:
    return PettingZooEnv(spread(max_cycles), seed=seed)


def greedy_agents(group: str = "agent") -> TensorDictModule:
    """A deterministic policy over a group: argmax of a fixed linear map of each observation."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(18, 5)
    return TensorDictModule(
        lambda observation: linear(observation).argmax(-1),
        in_keys=[(group, "observation")],
        out_keys=[(group, "action")],
    )

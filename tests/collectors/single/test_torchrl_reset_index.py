"""Collector.reset(index=...): TorchRL's reset of some sub-envs of a batched env, side by side
with TorchRL's Collector."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import TensorDictBase

from rlcollect import Collector
from rlcollect.testing import CountingEnv
from tests.collectors.policies import greedy_module
from tests.collectors.single.torchrl_parity import assert_same_batches

torchrl_collectors = pytest.importorskip("torchrl.collectors")
torchrl_envs = pytest.importorskip("torchrl.envs")


def cartpoles() -> Any:
    """Three TorchRL CartPoles counting their steps, seeded."""
    env = torchrl_envs.TransformedEnv(
        torchrl_envs.SerialEnv(3, lambda: torchrl_envs.GymEnv("CartPole-v1")),
        torchrl_envs.StepCounter(),
    )
    env.set_seed(11)
    return env


def batches_around_reset(collector_class: type, index: Any) -> list[TensorDictBase]:
    """Two batches, with `reset(index=index)` between them."""
    collector = collector_class(cartpoles(), greedy_module(), frames_per_batch=30)
    try:
        batches = iter(collector)
        first = next(batches)
        collector.reset(index=index)
        return [first, next(batches)]
    finally:
        collector.shutdown()


@pytest.mark.parametrize("index", [1, [0, 2]])
def test_reset_of_some_sub_envs_as_torchrl(index: Any) -> None:
    ours = batches_around_reset(Collector, index)
    assert_same_batches(ours, batches_around_reset(torchrl_collectors.Collector, index))
    reset = torch.zeros(3, dtype=torch.bool)
    reset[index] = True
    after = ours[1]
    # The reset sub-envs start over (step count 0) with new trajectory ids; the others go on.
    assert (after["step_count"][reset, 0] == 0).all()
    assert (after["step_count"][~reset, 0] > 0).all()
    new_ids = after["collector", "traj_ids"][reset, 0]
    assert (new_ids > ours[0]["collector", "traj_ids"].max()).all()


def test_reset_index_needs_a_batch_of_sub_envs() -> None:
    collector = Collector(CountingEnv(), None, frames_per_batch=4)
    with pytest.raises(ValueError, match=r"reset\(index=0\): the env has no batch of sub-envs"):
        collector.reset(index=0)
    collector.shutdown()


def test_reset_index_out_of_the_env_batch_is_refused() -> None:
    collector = Collector(cartpoles(), None, frames_per_batch=6)
    with pytest.raises(ValueError, match=r"reset\(index=5\) does not index the env batch"):
        collector.reset(index=5)
    collector.shutdown()

"""Our collector beside TorchRL's: collect_both, collect_all and assert_same_batches."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rlcollect import Collector
from rlcollect.envs import GymEnv
from tests.collectors.policies import greedy_module

torchrl_collectors = pytest.importorskip("torchrl.collectors")
torchrl_envs = pytest.importorskip("torchrl.envs")

FRAMES_PER_BATCH = 150
TOTAL_FRAMES = 600


def collect_both(**options: object) -> tuple[list[TensorDict], list[TensorDict]]:
    ours_env = GymEnv("CartPole-v1")
    ours_env.set_seed(7)
    ours = Collector(
        ours_env,
        greedy_module(),
        frames_per_batch=FRAMES_PER_BATCH,
        total_frames=TOTAL_FRAMES,
        **options,
    )
    theirs_env = torchrl_envs.GymEnv("CartPole-v1")
    theirs_env.set_seed(7)
    theirs = torchrl_collectors.Collector(
        theirs_env,
        greedy_module(),
        frames_per_batch=FRAMES_PER_BATCH,
        total_frames=TOTAL_FRAMES,
        **options,
    )
    try:
        return list(ours), list(theirs)
    finally:
        ours.shutdown()
        theirs.shutdown()


def collect_all(collector_class: type, env: object, **options: object) -> list[TensorDict]:
    """Every batch of `collector_class` over `env` with the greedy policy, then shut down."""
    collector = collector_class(env, greedy_module(), **options)
    try:
        return list(collector)
    finally:
        collector.shutdown()


def assert_same_batches(
    ours: list[TensorDict], theirs: list[TensorDict], compare_names: bool = True
) -> None:
    assert len(ours) == len(theirs)
    for index, (mine, reference) in enumerate(zip(ours, theirs, strict=True)):
        assert mine.batch_size == reference.batch_size, index
        if compare_names:
            assert mine.names == reference.names, index
        my_keys = set(mine.keys(include_nested=True, leaves_only=True))
        their_keys = set(reference.keys(include_nested=True, leaves_only=True))
        assert my_keys == their_keys, (index, my_keys ^ their_keys)
        for key in their_keys:
            assert mine[key].shape == reference[key].shape, (index, key)
            assert mine[key].dtype == reference[key].dtype, (index, key)
            assert torch.equal(mine[key], reference[key]), (index, key)

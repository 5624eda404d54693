"""Grouped (multi-agent) batches from a PettingZoo collector through the replay buffers: what
comes back equals what went in, the group's agent dim included."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tensordict import TensorDictBase

from rlcollect import Collector
from rlcollect.envs import SerialEnv
from rlcollect.envs.pettingzoo_env import PettingZooEnv
from rlcollect.replay import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    SliceSampler,
    Storage,
)

pytest.importorskip("mpe2")
from mpe2 import simple_spread_v3

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TRAJ_IDS = ("collector", "traj_ids")


def spread_env() -> PettingZooEnv:
    env = simple_spread_v3.parallel_env(N=3, continuous_actions=False, max_cycles=10)
    return PettingZooEnv(env, group_map="all_in_one", seed=0)


@functools.cache
def grouped_batch() -> TensorDictBase:
    """[2 envs, 40 steps] of simple_spread under random actions, 3 agents under "agents"."""
    collector = Collector(SerialEnv(2, spread_env), None, frames_per_batch=80, total_frames=80)
    batch = collector.next()
    collector.shutdown()
    assert batch["agents"].batch_size == (2, 40, 3)
    return batch


STORAGES: dict[str, Callable[[Path], Storage]] = {
    "memory": lambda _: LazyTensorStorage(200),
    "memmap": lambda path: LazyMemmapStorage(200, scratch_dir=path / "memmap"),
    "list": lambda _: ListStorage(200),
}


def assert_same_frames(sample: TensorDictBase, frames: TensorDictBase) -> None:
    """`sample` (without its "index") holds exactly `frames`: keys, nested batch sizes, values."""
    sample = sample.exclude("index")
    assert sample["agents"].batch_size == frames["agents"].batch_size
    assert sample["next", "agents"].batch_size == frames["next", "agents"].batch_size
    assert set(sample.keys(True, True)) == set(frames.keys(True, True))
    for key, value in frames.items(True, True):
        assert torch.equal(sample[key], value), key


@pytest.mark.parametrize("storage", STORAGES)
def test_grouped_frames_come_back_as_they_went_in(storage: str, tmp_path: Path) -> None:
    batch = grouped_batch()
    buffer = ReplayBuffer(storage=STORAGES[storage](tmp_path))
    assert buffer.extend(batch).tolist() == list(range(80))
    flat = batch.reshape(-1)
    sample = buffer.sample(32)
    assert sample["agents", "observation"].shape == (32, 3, 18)
    assert sample["next", "agents", "reward"].shape == (32, 3, 1)
    assert_same_frames(sample, flat[sample["index"]])
    assert_same_frames(buffer.storage.get(torch.arange(80)), flat)


def test_a_reopened_memmap_storage_keeps_the_agent_dim(tmp_path: Path) -> None:
    batch = grouped_batch()
    ReplayBuffer(storage=LazyMemmapStorage(200, scratch_dir=tmp_path)).extend(batch)
    reopened = ReplayBuffer(storage=LazyMemmapStorage.open(tmp_path))
    assert_same_frames(reopened.storage.get(torch.arange(80)), batch.reshape(-1))


@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_slices_of_grouped_frames_are_whole_steps_of_one_trajectory(
    storage: str, tmp_path: Path
) -> None:
    batch = grouped_batch()
    buffer = ReplayBuffer(
        storage=STORAGES[storage](tmp_path),
        sampler=SliceSampler(slice_len=5, traj_key=TRAJ_IDS),
        generator=torch.Generator().manual_seed(0),
    )
    buffer.extend(batch)
    sample = buffer.sample(40)
    assert sample["agents", "observation"].shape == (40, 3, 18)
    stored = batch.reshape(-1)[sample["index"]]
    # The sampler marks the last step of each slice truncated (and done), as TorchRL's does.
    slice_end = (torch.arange(40) % 5 == 4).unsqueeze(-1)
    for name in ("done", "truncated"):
        assert torch.equal(sample["next", name], stored["next", name] | slice_end)
        stored["next", name] = sample["next", name]
    assert_same_frames(sample, stored)
    slices = sample.reshape(8, 5)
    assert slices["agents"].batch_size == (8, 5, 3)
    traj = slices[TRAJ_IDS]
    assert (traj == traj[:, :1]).all(), "a slice mixes trajectories"
    assert (slices["index"].diff(dim=1) == 1).all(), "a slice skips or reorders steps"


def test_a_collector_extends_a_buffer_with_grouped_frames(tmp_path: Path) -> None:
    buffer = ReplayBuffer(storage=LazyMemmapStorage(100, scratch_dir=tmp_path))
    collector = Collector(
        spread_env(), None, frames_per_batch=20, total_frames=40, replay_buffer=buffer
    )
    assert list(collector) == [None, None]
    collector.shutdown()
    stored = buffer.storage.get(torch.arange(40))
    assert stored["agents"].batch_size == (40, 3)
    assert stored["next", "agents", "reward"].shape == (40, 3, 1)
    assert stored[TRAJ_IDS].tolist() == [0] * 10 + [1] * 10 + [2] * 10 + [3] * 10

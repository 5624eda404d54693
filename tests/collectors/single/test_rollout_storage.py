"""Collector.collect_rollout: writing straight into a preallocated [N, T + 1] storage."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rlcollect import Collector
from rlcollect.testing import CountingEnv


def test_collect_rollout_writes_in_place_and_chains() -> None:
    collector = Collector(
        CountingEnv(episode_length=100, batch_size=(2,)), None, frames_per_batch=8, total_frames=-1
    )
    storage = TensorDict({"observation": torch.zeros(2, 5, 1)}, batch_size=[2, 5])
    observation = storage["observation"]
    result = collector.collect_rollout(storage)
    assert result is storage
    assert storage["observation"] is observation, "the storage's own tensor is written"
    assert storage["observation"][0, :, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert ("next", "reward") in storage.keys(include_nested=True)
    assert ("collector", "traj_ids") in storage.keys(include_nested=True)
    collector.collect_rollout(storage)
    # the last observation of one rollout is the first of the next
    assert storage["observation"][0, :, 0].tolist() == [4.0, 5.0, 6.0, 7.0, 8.0]
    assert collector.frames == 16


def test_collect_rollout_rejects_wrong_shape() -> None:
    collector = Collector(CountingEnv(batch_size=(2,)), None, frames_per_batch=8)
    with pytest.raises(ValueError, match=r"this collector writes \(2, 5\)"):
        collector.collect_rollout(TensorDict({}, batch_size=[2, 4]))


def test_collect_rollout_writes_into_the_storage_only_during_the_call() -> None:
    collector = Collector(
        CountingEnv(episode_length=100, batch_size=(2,)), None, frames_per_batch=8, total_frames=-1
    )
    storage = TensorDict({}, batch_size=[2, 5])
    collector.collect_rollout(storage)
    kept = storage["observation"].clone()
    batch = collector.next()  # a plain batch goes to the collector's own buffer...
    assert torch.equal(storage["observation"], kept), "...not into the rollout storage"
    assert batch["observation"][0, :, 0].tolist() == [4.0, 5.0, 6.0, 7.0]
    collector.collect_rollout(storage)  # and the next rollout goes on from that batch
    assert storage["observation"][0, :, 0].tolist() == [8.0, 9.0, 10.0, 11.0, 12.0]


def test_collect_rollout_refuses_entries_of_the_wrong_shape_and_stays_usable() -> None:
    collector = Collector(CountingEnv(batch_size=(2,)), None, frames_per_batch=8)
    storage = TensorDict({"observation": torch.zeros(2, 5, 3)}, batch_size=[2, 5])
    with pytest.raises(ValueError, match=r"'observation' is \(2, 5, 3\) torch.float32; this"):
        collector.collect_rollout(storage)
    assert set(storage.keys()) == {"observation"}, "the storage was changed"
    assert collector.next()["observation"].shape == (2, 4, 1)


def test_collect_rollout_counts_towards_total_frames() -> None:
    collector = Collector(CountingEnv(batch_size=(2,)), None, frames_per_batch=8, total_frames=16)
    storage = TensorDict({}, batch_size=[2, 5])
    collector.collect_rollout(storage)
    collector.collect_rollout(storage)
    with pytest.raises(StopIteration):
        collector.collect_rollout(storage)

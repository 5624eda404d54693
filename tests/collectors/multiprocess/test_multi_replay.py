"""Multi-process collectors and replay buffers: shared buffers filled by workers, TorchRL's."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from rlcollect import keys
from rlcollect.collectors import MultiAsyncCollector, MultiSyncCollector
from rlcollect.errors import MisuseError
from rlcollect.replay import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer
from rlcollect.testing import CountingEnv
from tests.conftest import processes_gone as gone

pytestmark = pytest.mark.timeout(120)
# Every test here checks that its processes and shared memory are gone, the one that uses
# TorchRL's replay buffer by hand: that buffer leaves named semaphores of its own behind.
NOTHING_LEFT = pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")


def counting_env() -> CountingEnv:
    return CountingEnv(episode_length=7)


def wait_until(condition: Callable[[], bool], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def shared_buffer(kind: str, tmp_path: Path, size: int = 5000) -> ReplayBuffer:
    storage = (
        LazyTensorStorage(size)
        if kind == "tensor"
        else LazyMemmapStorage(size, scratch_dir=tmp_path / "buffer")
    )
    return ReplayBuffer(storage=storage, shared=True)


def assert_every_frame_once(stored: object) -> None:
    """Each trajectory's frames are there once each, in a run of counts 0, 1, 2, ..."""
    ids = stored[keys.TRAJ_IDS].flatten()
    counts = stored["observation"].flatten().long()
    pairs = set(zip(ids.tolist(), counts.tolist(), strict=True))
    assert len(pairs) == len(ids), "a frame was written twice"
    for trajectory in ids.unique().tolist():
        steps = sorted(counts[ids == trajectory].tolist())
        assert steps == list(range(steps[0], steps[0] + len(steps))), "a frame is missing"


@NOTHING_LEFT
@pytest.mark.parametrize("kind", ["tensor", "memmap"])
def test_start_fills_one_shared_buffer_from_every_worker(kind: str, tmp_path: Path) -> None:
    buffer = shared_buffer(kind, tmp_path)
    with MultiSyncCollector(
        counting_env, num_workers=2, frames_per_batch=40, total_frames=800, replay_buffer=buffer
    ) as collector:
        collector.start()
        wait_until(lambda: buffer.write_count >= 800)
        time.sleep(0.2)
        collector.async_shutdown()
        # What the workers ended with stays readable, for a last checkpoint.
        stats, state = collector.stats(), collector.state_dict()
        assert collector.is_done
    assert buffer.write_count == stats["frames"] == 800
    assert [worker["frames"] for worker in state["workers"]] == [400, 400]
    assert [worker["frames"] for worker in stats["per_worker"]] == [400, 400]
    stored = buffer[torch.arange(len(buffer))]
    assert_every_frame_once(stored)
    trajectories = stored[keys.TRAJ_IDS].unique()
    assert len(trajectories) >= 800 // 7
    assert set((trajectories % 2).tolist()) == {0, 1}  # worker i of 2 hands out i, i + 2, ...
    buffer.close()


@NOTHING_LEFT
def test_pause_freezes_every_writer() -> None:
    buffer = shared_buffer("tensor", Path())
    with MultiAsyncCollector(
        counting_env, num_workers=2, frames_per_batch=10, replay_buffer=buffer
    ) as collector:
        collector.start()
        wait_until(lambda: buffer.write_count > 100)
        with pytest.raises(MisuseError, match=r"next\(\) cannot run while the workers fill"):
            collector.next()
        with collector.pause():
            frozen = buffer.write_count
            time.sleep(0.5)
            assert buffer.write_count == frozen
            collector.set_seed(3)  # allowed while paused
        wait_until(lambda: buffer.write_count > frozen + 100)
        collector.async_shutdown()
    assert_every_frame_once(buffer[torch.arange(len(buffer))])
    buffer.close()


@NOTHING_LEFT
def test_iteration_with_a_buffer_extends_it_from_the_workers() -> None:
    buffer = shared_buffer("tensor", Path())
    with MultiSyncCollector(
        counting_env, num_workers=2, frames_per_batch=20, total_frames=60, replay_buffer=buffer
    ) as collector:
        assert list(collector) == [None, None, None]
    assert buffer.write_count == 60
    buffer.close()


@NOTHING_LEFT
def test_torchrl_envs_run_in_workers() -> None:
    torchrl_envs = pytest.importorskip("torchrl.envs")
    with MultiSyncCollector(
        lambda: torchrl_envs.GymEnv("CartPole-v1"),
        num_workers=2,
        frames_per_batch=100,
        total_frames=200,
    ) as collector:
        batches = list(collector)
    for batch in batches:
        assert batch.batch_size == torch.Size([2, 50])
        assert batch.names == [None, "time"]
        assert batch["next", "observation"].shape == (2, 50, 4)


def test_batches_extend_torchrl_buffers() -> None:
    torchrl_data = pytest.importorskip("torchrl.data")
    with MultiSyncCollector(
        counting_env, num_workers=2, frames_per_batch=20, total_frames=40
    ) as collector:
        batches = list(collector)
        pids = collector.process_ids()
    assert gone(pids, 5)
    buffer = torchrl_data.ReplayBuffer(storage=torchrl_data.LazyTensorStorage(1000))
    for batch in batches:
        buffer.extend(batch.reshape(-1))
    assert len(buffer) == 40
    sample = buffer.sample(32)
    assert sample["next", "observation"].shape == (32, 1)
    assert sample[keys.TRAJ_IDS].shape == (32,)


@NOTHING_LEFT
def test_workers_writing_the_buffer_apply_postproc_and_split_trajs() -> None:
    buffer = shared_buffer("tensor", Path())
    with MultiSyncCollector(
        counting_env,
        num_workers=2,
        frames_per_batch=14,
        total_frames=28,
        replay_buffer=buffer,
        split_trajs=True,
        postproc=mark_processed,
    ) as collector:
        list(collector)
    stored = buffer[torch.arange(len(buffer))]
    assert stored["processed"].all()
    assert stored[keys.MASK].shape == stored["processed"].shape  # split: [trajs, len] rows
    buffer.close()


def mark_processed(batch: object) -> object:
    batch.set("processed", torch.ones(batch.batch_size, dtype=torch.bool))  # type: ignore[attr-defined]
    return batch

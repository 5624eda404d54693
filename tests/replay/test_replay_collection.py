"""Collectors feeding replay: straight into a RolloutBuffer's storage, or into a ReplayBuffer."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from rlcollect import Collector
from rlcollect.replay import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ReplayBuffer,
    RolloutBuffer,
    SliceSampler,
    transition_view,
)
from rlcollect.testing import CountingEnv

N, T, EPISODE = 3, 5, 4


def counting_collector(
    frames_per_batch: int, total_frames: int = -1, **options: object
) -> Collector:
    env = CountingEnv(episode_length=EPISODE, batch_size=(N,))
    return Collector(
        env, None, frames_per_batch=frames_per_batch, total_frames=total_frames, **options
    )


def expected_steps(first_step: int, count: int) -> torch.Tensor:
    """Steps since the last reset of every sub-env (they run in lockstep), from ``first_step``."""
    return (torch.arange(first_step, first_step + count) % EPISODE).float().expand(N, count)


def test_collector_writes_straight_into_a_rollout_buffer() -> None:
    collector = counting_collector(N * T)
    frame = RolloutBuffer.frame_example((1,), (), action_dtype=torch.int64)
    buffer = RolloutBuffer(N, T, frame)
    pointers = {key: leaf.data_ptr() for key, leaf in buffer.rollout.items(True, True)}
    for index in range(3):
        rollout = buffer.start_rollout()
        assert collector.collect_rollout(rollout) is buffer.rollout
        buffer.add(rollout)
        transitions = transition_view(buffer.get(flatten=False))
        first = index * T
        steps = expected_steps(first, T)
        assert torch.equal(transitions["observation"][..., 0], steps)
        assert torch.equal(transitions["next", "observation"][..., 0], steps + 1)
        assert torch.equal(transitions["next", "done"][..., 0], steps == EPISODE - 1)
        episode = torch.arange(first, first + T) // EPISODE
        assert torch.equal(
            transitions["collector", "traj_ids"], torch.arange(N)[:, None] + N * episode
        )
        assert torch.equal(transitions["next", "reward"], torch.ones(N, T, 1))
        # slot T holds the observation the next rollout starts from
        assert torch.equal(rollout["observation"][:, T, 0], expected_steps(first + T, 1)[:, 0])
    after = {key: leaf.data_ptr() for key, leaf in buffer.rollout.items(True, True)}
    assert after == pointers, "the collector replaced a leaf instead of writing into it"
    assert collector.frames == 3 * N * T


def test_rollout_buffer_minibatches_of_collected_transitions() -> None:
    collector = counting_collector(N * T)
    buffer = RolloutBuffer(N, T, RolloutBuffer.frame_example((1,), (), action_dtype=torch.int64))
    rollout = buffer.start_rollout()
    collector.collect_rollout(rollout)
    # --- an algorithm attaches its own entries to the shared rollout ---
    rollout["advantage"] = torch.arange(N * (T + 1), dtype=torch.float32).reshape(N, T + 1)
    buffer.add(rollout)
    flat = buffer.get()
    assert flat["advantage"].tolist() == [n * (T + 1) + t for n in range(N) for t in range(T)]
    batches = list(buffer.iterate_minibatches(flat, 4, generator=torch.Generator().manual_seed(0)))
    assert [len(batch) for batch in batches] == [4, 4, 4, 3]
    drawn = torch.cat([batch["advantage"] for batch in batches])
    assert sorted(drawn.tolist()) == sorted(flat["advantage"].tolist())


def test_iterating_a_collector_fills_a_replay_buffer_with_whole_trajectories() -> None:
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(1000),
        sampler=SliceSampler(slice_len=EPISODE, traj_key=("collector", "traj_ids")),
        generator=torch.Generator().manual_seed(0),
    )
    collector = counting_collector(N * 8, total_frames=N * 8 * 5, replay_buffer=buffer)
    assert list(collector) == [None] * 5
    assert len(buffer) == buffer.write_count == N * 8 * 5
    slices = buffer.sample(EPISODE * 50).reshape(50, EPISODE)
    # EPISODE-step slices of EPISODE-step trajectories are whole episodes: 0, 1, 2, 3
    assert (slices["observation"][..., 0] == torch.arange(EPISODE).float()).all()
    assert (slices["collector", "traj_ids"] == slices["collector", "traj_ids"][:, :1]).all()


@pytest.mark.timeout(60)
def test_start_fills_a_shared_memmap_buffer_in_the_background(tmp_path: Path) -> None:
    buffer = ReplayBuffer(storage=LazyMemmapStorage(10_000, scratch_dir=tmp_path), shared=True)
    collector = counting_collector(N * 10, total_frames=N * 10 * 20, replay_buffer=buffer)
    collector.start()
    deadline = time.monotonic() + 30
    while buffer.write_count < N * 10 * 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    collector.async_shutdown(timeout=10)
    assert not any(thread.name == "rlcollect-collector" for thread in threading.enumerate())
    assert buffer.write_count == len(buffer) == N * 10 * 20
    reopened = ReplayBuffer(storage=LazyMemmapStorage.open(tmp_path))
    observations = reopened[torch.arange(len(reopened))]["observation"][:, 0]
    frame = torch.arange(len(reopened))
    step = frame // (N * 10) * 10 + frame % 10  # batches are [env, time], flattened env-major
    assert torch.equal(observations, (step % EPISODE).float())

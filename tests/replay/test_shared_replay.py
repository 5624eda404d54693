"""Shared buffers: worker processes extend one buffer while this process samples it."""

from __future__ import annotations

import gc
import multiprocessing
import os
from pathlib import Path

import pytest
import torch

from rlcollect.errors import MisuseError
from rlcollect.replay import (
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSampler,
    ReplayBuffer,
)
from rlcollect.runtime.processes import worker_context
from tests.replay.replay_workers import extend_shared, transitions

ITEMS_PER_WORKER = 10_000


def fresh_process_context() -> multiprocessing.context.BaseContext:
    """New processes that get the buffer pickled, as spawned ones do, but forked from the
    preloaded fork server of our workers (a spawned interpreter imports torch: seconds)."""
    return worker_context(None)


def check_frames_consistent(sample: torch.Tensor) -> None:
    ids = sample["id"].float()
    assert torch.equal(sample["observation"][:, 0], ids), "a sampled frame is torn"
    assert torch.equal(sample["next", "observation"][:, 0], ids + 1), "a sampled frame is torn"


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("no_leftover_children")
@pytest.mark.parametrize("kind", ["tensor", "memmap"])
def test_two_processes_extend_one_shared_buffer_while_it_is_sampled(
    kind: str, tmp_path: Path
) -> None:
    context = fresh_process_context()
    max_size = 2 * ITEMS_PER_WORKER + 500
    storage = (
        LazyTensorStorage(max_size)
        if kind == "tensor"
        else LazyMemmapStorage(max_size, scratch_dir=tmp_path / "buffer")
    )
    buffer = ReplayBuffer(storage=storage, shared=True)
    go = context.Barrier(3)  # both workers and this process start together
    workers = [
        context.Process(target=extend_shared, args=(buffer, worker, ITEMS_PER_WORKER, 97, go))
        for worker in (1, 2)
    ]
    try:
        for worker in workers:
            worker.start()
        go.wait(timeout=120)
        samples = 0
        while any(worker.is_alive() for worker in workers):
            if len(buffer) > 0:
                check_frames_consistent(buffer.sample(64))
                samples += 1
        for worker in workers:
            worker.join()
        assert [worker.exitcode for worker in workers] == [0, 0]
        assert buffer.write_count == 2 * ITEMS_PER_WORKER
        assert len(buffer) == 2 * ITEMS_PER_WORKER
        stored = buffer[torch.arange(len(buffer))]
        check_frames_consistent(stored)
        expected = [w * 10**6 + i for w in (1, 2) for i in range(ITEMS_PER_WORKER)]
        assert sorted(stored["id"].tolist()) == expected  # every item exactly once
        writer_of_slot = stored["id"] // 10**6
        assert (writer_of_slot.diff() != 0).sum() > 2, "the workers did not write concurrently"
        assert samples > 0
    finally:
        for worker in workers:
            worker.join(timeout=30)
        buffer.close()
        del go


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children")
def test_prioritized_sampler_catches_up_with_items_written_by_workers(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    buffer = ReplayBuffer(
        storage=LazyMemmapStorage(3000, scratch_dir=tmp_path),
        sampler=PrioritizedSampler(3000, alpha=1.0, beta=1.0),
        shared=True,
    )
    buffer.extend(transitions(10))
    buffer.update_priority(torch.arange(10), torch.full((10,), 3.0))
    workers = [
        context.Process(target=extend_shared, args=(buffer, worker, 1000, 50)) for worker in (1, 2)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert [worker.exitcode for worker in workers] == [0, 0]
    _, info = buffer.sample(4000, return_info=True)
    assert len(buffer) == 2010
    assert torch.bincount(info["index"], minlength=2010).gt(0).sum() > 1500
    assert torch.allclose(info["priority_weight"], torch.ones(4000))  # all share priority 3


def write_to_private_copy(buffer: ReplayBuffer, result: multiprocessing.Queue) -> None:
    try:
        buffer.extend(transitions(1))
    except MisuseError as error:
        result.put(str(error))
    else:
        result.put("no error")


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leftover_children")
def test_non_shared_buffers_refuse_writes_from_worker_processes() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(8))
    buffer.extend(transitions(2))
    context = multiprocessing.get_context("fork")
    result = context.Queue()
    child = context.Process(target=write_to_private_copy, args=(buffer, result))
    child.start()
    message = result.get(timeout=30)
    child.join()
    assert "build the replay buffer with shared=True" in message
    spawned = multiprocessing.get_context("spawn").Process(
        target=write_to_private_copy, args=(buffer, result)
    )
    with pytest.raises(MisuseError, match="was sent to a new process"):
        spawned.start()
    result.close()
    result.join_thread()


def test_shared_memory_files_are_removed_with_the_buffer() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(8), shared=True)
    buffer.extend(transitions(3))
    directory = Path(buffer.storage._directory.path)  # type: ignore[attr-defined]
    assert directory.exists()
    assert str(directory).startswith("/dev/shm/") or not Path("/dev/shm").exists()
    buffer.close()
    assert not directory.exists()
    collected = ReplayBuffer(storage=LazyTensorStorage(8), shared=True)
    directory = Path(collected.storage._directory.path)  # type: ignore[attr-defined]
    del collected
    gc.collect()
    assert not directory.exists()


def test_sharing_an_initialized_storage_keeps_its_items() -> None:
    storage = LazyTensorStorage(8)
    ReplayBuffer(storage=storage).extend(transitions(5))
    buffer = ReplayBuffer(storage=storage, shared=True)
    assert buffer[torch.arange(5)]["id"].tolist() == [0, 1, 2, 3, 4]
    assert buffer.write_count == 5
    assert os.path.isdir(storage._directory.path)  # type: ignore[union-attr]
    buffer.close()


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children")
@pytest.mark.parametrize("kind", ["tensor", "memmap"])
def test_storage_reads_see_what_only_workers_wrote(kind: str, tmp_path: Path) -> None:
    """`buffer.storage[index]` is the first read in this process: it must map the workers' data."""
    context = fresh_process_context()
    storage = (
        LazyTensorStorage(100)
        if kind == "tensor"
        else LazyMemmapStorage(100, scratch_dir=tmp_path / "buffer")
    )
    buffer = ReplayBuffer(storage=storage, shared=True)
    worker = context.Process(target=extend_shared, args=(buffer, 1, 40, 10))
    try:
        worker.start()
        worker.join(timeout=100)
        assert worker.exitcode == 0
        items = buffer.storage[torch.arange(40)]
        check_frames_consistent(items)
        assert sorted(items["id"].tolist()) == [10**6 + i for i in range(40)]
    finally:
        worker.join(timeout=30)
        buffer.close()

"""Workers killed at the worst moments: inside `extend`, while filling the buffer in the
background, deep in a nested collector; and a short run of the chaos soak."""

from __future__ import annotations

import functools
import importlib.util
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from rlcollect.collectors import MultiAsyncCollector, MultiSyncCollector
from rlcollect.collectors.children import RESTART_ID_GAP
from rlcollect.errors import WorkerError
from rlcollect.replay import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer
from rlcollect.testing.soak import audit_buffer, worker_pids
from tests.collectors.multiprocess.chaos_parts import (
    AFTER_COMMIT,
    BEFORE_COMMIT,
    MID_WRITE,
    DieInExtendWriter,
    counting_env,
)
from tests.conftest import SEMAPHORE_PREFIX
from tests.conftest import processes_gone as gone

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]
ROOT = Path(__file__).resolve().parents[3]


def shared_buffer(storage: str, tmp_path: Path, writer: object = None) -> ReplayBuffer:
    kept = (
        LazyTensorStorage(20_000)
        if storage == "memory"
        else LazyMemmapStorage(20_000, scratch_dir=tmp_path / "buffer")
    )
    return ReplayBuffer(storage=kept, writer=writer, shared=True)  # type: ignore[arg-type]


def wait_until(condition: Callable[[], bool], within: float = 60.0, interval: float = 0.02) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(interval)


def assert_buffer_matches(buffer: ReplayBuffer, frames: int) -> None:
    """What the buffer holds is what the collector counted, each frame once, trajectories
    whole from their first step."""
    assert len(buffer) == buffer.write_count == frames
    audit = audit_buffer(buffer[torch.arange(len(buffer))], frames)
    assert audit.clean, audit


# --- a worker killed inside extend ----------------------------------------------------------


@pytest.mark.parametrize(
    ("storage", "where"),
    [
        ("memory", BEFORE_COMMIT),
        ("memmap", BEFORE_COMMIT),
        ("memmap", MID_WRITE),
        ("memory", AFTER_COMMIT),
    ],
)
def test_a_worker_killed_inside_extend_leaves_its_batch_whole_or_absent(
    storage: str, where: str, tmp_path: Path
) -> None:
    marker = tmp_path / "died"
    buffer = shared_buffer(storage, tmp_path, DieInExtendWriter(where, marker, after=3))
    collector = MultiSyncCollector(
        counting_env, num_workers=1, frames_per_batch=50, total_frames=1000, replay_buffer=buffer
    )
    with pytest.raises(WorkerError, match=r"worker 0 failed: .*died \(signal SIGKILL\)"):
        for _ in collector:
            pass
    seen, count = (int(value) for value in marker.read_text().split())
    assert seen == 100  # two batches committed before the third extend
    # Before the commit: as if the batch never happened; after it: all of it, counted.
    expected = seen + count if where == AFTER_COMMIT else seen
    assert collector.frames == expected
    assert_buffer_matches(buffer, expected)
    collector.shutdown()
    buffer.close()


def test_a_worker_killed_after_its_commit_in_the_background_is_counted(tmp_path: Path) -> None:
    marker = tmp_path / "died"
    buffer = shared_buffer("memmap", tmp_path, DieInExtendWriter(AFTER_COMMIT, marker, after=3))
    collector = MultiAsyncCollector(
        counting_env,
        num_workers=2,
        frames_per_batch=50,
        total_frames=2000,
        replay_buffer=buffer,
        restart_dead_workers=True,
    )
    collector.start()
    wait_until(lambda: marker.exists() and buffer.write_count >= 2000)
    collector.async_shutdown()
    assert sum(worker["restarts"] for worker in collector.stats()["per_worker"]) == 1
    assert_buffer_matches(buffer, collector.frames)
    buffer.close()


# --- the watchdog ---------------------------------------------------------------------------


def test_the_watchdog_restarts_a_worker_that_dies_in_the_background(tmp_path: Path) -> None:
    buffer = shared_buffer("memory", tmp_path)
    collector = MultiSyncCollector(
        counting_env,
        num_workers=2,
        frames_per_batch=40,
        total_frames=12_000,
        replay_buffer=buffer,
        restart_dead_workers=True,
    )
    collector.start()
    wait_until(lambda: buffer.write_count > 0)
    os.kill(collector.pool.pids[1], signal.SIGKILL)
    # Nothing is called on the collector: the watchdog notices the death by itself.
    wait_until(lambda: collector.pool.slots[1].restarts == 1)
    restarted_ids = 1 + 2 * RESTART_ID_GAP  # worker 1 of 2, after one restart

    def restarted_worker_wrote() -> bool:
        ids = buffer[torch.arange(len(buffer))]["collector", "traj_ids"]
        return int(ids.max()) >= restarted_ids

    wait_until(restarted_worker_wrote)
    collector.async_shutdown()
    assert_buffer_matches(buffer, collector.frames)
    buffer.close()


def test_the_watchdog_reports_a_dead_worker_and_stops_the_others(tmp_path: Path) -> None:
    buffer = shared_buffer("memory", tmp_path)
    collector = MultiSyncCollector(
        counting_env, num_workers=2, frames_per_batch=40, replay_buffer=buffer
    )
    pids = collector.pool.pids
    collector.start()
    wait_until(lambda: buffer.write_count > 0)
    os.kill(pids[1], signal.SIGKILL)
    wait_until(lambda: not collector.pool.is_open)  # shut down without a call
    assert gone(pids, 10), "the other worker still runs"
    with pytest.raises(WorkerError, match=r"worker 1 failed: .*died \(signal SIGKILL\)"):
        _ = collector.frames
    assert_buffer_matches(buffer, collector.frames)
    collector.shutdown()
    buffer.close()


# --- nested collectors ----------------------------------------------------------------------


def test_restart_dead_workers_reaches_a_killed_grandchild(tmp_path: Path) -> None:
    buffer = shared_buffer("memory", tmp_path)
    collector = MultiSyncCollector(
        counting_env,
        num_workers=2,
        collector_class=functools.partial(MultiSyncCollector, num_workers=2),
        frames_per_batch=80,
        total_frames=16_000,
        replay_buffer=buffer,
        restart_dead_workers=True,
    )
    collector.start()
    wait_until(lambda: buffer.write_count > 0)
    grandchild = worker_pids(collector.stats(), depth=2)[3]
    os.kill(grandchild, signal.SIGKILL)

    def restarted() -> bool:
        child = collector.stats()["per_worker"][1]["collector"]
        return child["per_worker"][1]["restarts"] == 1

    wait_until(restarted, interval=0.5)
    grandchildren = worker_pids(collector.stats(), depth=2)
    assert grandchild not in grandchildren
    assert len(grandchildren) == 4
    collector.async_shutdown()
    assert_buffer_matches(buffer, collector.frames)
    buffer.close()


# --- the soak, short ------------------------------------------------------------------------


def load_soak() -> object:
    spec = importlib.util.spec_from_file_location("rlcollect_soak", ROOT / "benchmarks" / "soak.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["rlcollect_soak"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_short_soak_loses_doubles_and_leaves_nothing() -> None:
    soak = load_soak()
    prefix = SEMAPHORE_PREFIX  # this session's semaphores, as the leak fixtures see them
    # The checks of benchmarks/soak.py, on three of its configurations (the benchmark runs all).
    rows = [
        soak.soak_background("MultiSync", "memmap", 2.0, 0.25, False, prefix),  # type: ignore[attr-defined]
        soak.soak_iteration("MultiAsync", 2.0, 0.25, prefix),  # type: ignore[attr-defined]
        soak.soak_background("AsyncBatched", "memory", 2.0, 0.25, False, prefix),  # type: ignore[attr-defined]
    ]
    for row in rows:
        assert row.clean, row
        assert row.frames > 0
    assert sum(row.kills for row in rows) > 0

"""An env maker holding `multiprocessing` shared state reaches the workers, shared.

TorchRL's `TrajCounter` counts resets in a `multiprocessing.Value` that every env a TorchRL
`EnvCreator` makes shares: handed to the workers, one counter numbers every worker's
trajectories. cloudpickle cannot send such a value; our workers get it as multiprocessing
sends it when it starts a process (`rlcollect.runtime.payload`), as TorchRL's workers get it.
Side by side with TorchRL's `MultiSyncCollector` (run in a process of its own); a restarted
worker gets the maker, and the counter, again; `ParallelEnv`'s workers too.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from rlcollect.collectors import MultiAsyncCollector, MultiSyncCollector
from rlcollect.envs import ParallelEnv
from tests.collectors.multiprocess.frontends_side import (
    EPISODE_STEPS,
    TRAJ_COUNT,
    counts_per_worker,
    run_torchrl_side,
    shared_counter_maker,
)

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]
FRAMES_PER_BATCH = 40  # 20 a worker: 4 whole episodes of 5 steps
BATCHES = 2


@pytest.fixture(scope="module", autouse=True)
def _first_maker_built() -> Iterator[None]:
    """TorchRL keeps the first `EnvCreator` a process builds alive (frames of its
    construction stay referenced), and with it its counter's named semaphore: one is built
    here, before the leak checks look, so that they judge what the tests leave."""
    maker = shared_counter_maker()
    yield
    del maker


def shared_count(maker: Any) -> int:
    """The shared counter's value, as this process sees it (TorchRL's `EnvCreator` keeps the
    shared values it found in the env it made: `(path, value)` pairs)."""
    ((_, value),) = maker._mp_values
    return int(value.value)


def assert_counted_apart(batches: list[list[list[int]]]) -> None:
    """No trajectory count is seen by two workers: one counter numbered them all."""
    seen_by: dict[int, int] = {}
    for batch in batches:
        for worker, counts in enumerate(batch):
            for count in counts:
                assert seen_by.setdefault(count, worker) == worker, (count, batches)


def our_shared_counts(collector_class: type) -> dict[str, Any]:
    maker = shared_counter_maker()
    with collector_class(
        [maker, maker],
        None,
        frames_per_batch=FRAMES_PER_BATCH,
        total_frames=FRAMES_PER_BATCH * BATCHES,
        **(
            {"cat_results": "stack"}
            if collector_class is MultiSyncCollector
            else {"track_worker_id": True}
        ),
    ) as collector:
        if collector_class is MultiSyncCollector:
            batches = [counts_per_worker(batch) for batch in collector]
        else:  # one worker's batch at a time: gather them by worker
            by_worker: dict[int, list[int]] = {0: [], 1: []}
            for batch in collector:
                worker = int(batch["collector", "worker_id"].flatten()[0])
                by_worker[worker] += counts_per_worker(batch.unsqueeze(0))[0]
            batches = [[sorted(set(by_worker[0])), sorted(set(by_worker[1]))]]
    return {"batches": batches, "parent_count": shared_count(maker)}


def test_workers_count_in_one_shared_counter_as_torchrls() -> None:
    ours = our_shared_counts(MultiSyncCollector)
    theirs = run_torchrl_side(
        "shared_counts", {"frames_per_batch": FRAMES_PER_BATCH, "batches": BATCHES}
    )
    assert_counted_apart(ours["batches"])
    assert_counted_apart(theirs["batches"])
    # Each worker's part of a batch: 20 frames, 4 whole trajectories of 5 steps, on both.
    shape = [[len(counts) for counts in batch] for batch in theirs["batches"]]
    assert shape == [[20 // EPISODE_STEPS] * 2] * BATCHES
    assert [[len(counts) for counts in batch] for batch in ours["batches"]] == shape
    # The counter is this process's too: every reset of every worker counted in it.
    assert ours["parent_count"] == theirs["parent_count"]
    counted = {count for batch in ours["batches"] for counts in batch for count in counts}
    assert max(counted) < ours["parent_count"]


def test_async_workers_count_in_one_shared_counter() -> None:
    ours = our_shared_counts(MultiAsyncCollector)
    assert_counted_apart(ours["batches"])
    assert all(ours["batches"][0]), ours
    assert ours["parent_count"] > max(max(counts) for counts in ours["batches"][0])


def test_a_restarted_worker_gets_the_maker_and_its_counter_again() -> None:
    maker = shared_counter_maker()
    with MultiSyncCollector(
        [maker, maker],
        None,
        frames_per_batch=FRAMES_PER_BATCH,
        cat_results="stack",
        restart_dead_workers=True,
    ) as collector:
        before = counts_per_worker(collector.next())
        old_pid = collector.pool.pids[0]
        count_at_kill = shared_count(maker)
        os.kill(old_pid, signal.SIGKILL)
        after = [counts_per_worker(collector.next()) for _ in range(2)]
        stats = collector.stats()
    assert [worker["restarts"] for worker in stats["per_worker"]] == [1, 0]
    assert_counted_apart([before, *after])
    # The fresh worker 0 counts on from the shared value, not from a copy of its own.
    fresh = [count for batch in after for count in batch[0]]
    assert fresh
    assert min(fresh) >= count_at_kill
    assert shared_count(maker) > max(fresh)


def test_parallel_env_workers_share_the_counter() -> None:
    maker = shared_counter_maker()
    env = ParallelEnv(2, maker)
    try:
        rollout = env.rollout(3 * EPISODE_STEPS, break_when_any_done=False)
    finally:
        env.close()
    counts = rollout["next", TRAJ_COUNT].reshape(2, -1)
    first, second = ({int(value) for value in row} for row in counts)
    assert len(first) == len(second) == 3
    assert not first & second
    assert shared_count(maker) > max(first | second)

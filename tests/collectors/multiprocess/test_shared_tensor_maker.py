"""Tensors in shared memory that an env maker holds reach the workers shared, not copied.

A maker (a `functools.partial`, a closure, a TorchRL `EnvCreator`) may hold a tensor that
`share_memory_()` put in shared memory, for its envs to update together (running statistics,
a board). Our workers are handed the maker as multiprocessing hands a process its arguments,
with torch's reductions (`rlcollect.runtime.payload`), as TorchRL's workers are: a worker's write
is seen by this process and by the other workers, and this process's write by the workers.
The policy's tensors stay copied: a worker's policy changes only when weights are sent.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
import torch

from rlcollect.collectors import AsyncBatchedCollector, MultiAsyncCollector, MultiSyncCollector
from rlcollect.envs import ParallelEnv
from tests.collectors.multiprocess.frontends_side import run_torchrl_side
from tests.collectors.multiprocess.shared_board import (
    BOARD,
    PARENT_SLOT,
    board_makers,
    count_in_shared_statistics,
    first_action_policy,
    shared_board,
)

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]
FRAMES_PER_BATCH = 8  # 4 a worker
MARK = 7.0  # what this process writes into its slot of the board


def boards_by_worker(batch: Any, worker: int) -> torch.Tensor:
    """The boards worker `worker`'s env observed in a `[workers, T]` batch."""
    return batch["next", BOARD][worker]


@pytest.mark.parametrize("start_method", ["forkserver", "spawn", "fork"])
def test_sync_workers_write_into_one_board_with_this_process(start_method: str) -> None:
    board = shared_board(2)
    with MultiSyncCollector(
        board_makers(board),
        None,
        frames_per_batch=FRAMES_PER_BATCH,
        cat_results="stack",
        mp_start_method=start_method,
    ) as collector:
        collector.next()
        # A worker's writes reach this process: each tallied its reset and 4 steps at least.
        at_first = board.clone()
        assert (at_first[:PARENT_SLOT] >= 5).all(), at_first
        board[PARENT_SLOT] = MARK
        last = [collector.next() for _ in range(2)][-1]
    for worker, other in ((0, 1), (1, 0)):
        seen = boards_by_worker(last, worker)
        # This process's write reaches the workers ...
        assert (seen[:, PARENT_SLOT] == MARK).all(), seen
        # ... and each worker sees the other's tally, as it was here after the first batch.
        assert (seen[:, other] >= at_first[other]).all(), (seen, at_first)
    assert (board[:PARENT_SLOT] > at_first[:PARENT_SLOT]).all()


def test_async_workers_write_into_one_board_with_this_process() -> None:
    board = shared_board(2)
    seen_by: dict[int, torch.Tensor] = {}
    with MultiAsyncCollector(
        board_makers(board), None, frames_per_batch=4, track_worker_id=True
    ) as collector:
        collector.next()
        board[PARENT_SLOT] = MARK
        for _ in range(40):
            batch = collector.next()
            worker = int(batch["collector", "worker_id"].flatten()[0])
            seen_by[worker] = batch["next", BOARD]
            if len(seen_by) == 2 and all(
                (seen[:, PARENT_SLOT] == MARK).all() for seen in seen_by.values()
            ):
                break
    assert sorted(seen_by) == [0, 1]
    for worker, other in ((0, 1), (1, 0)):
        assert (seen_by[worker][:, PARENT_SLOT] == MARK).all(), seen_by
        assert (seen_by[worker][:, other] > 0).all(), seen_by
    assert (board[:PARENT_SLOT] >= 5).all(), board


def test_a_restarted_worker_writes_into_the_same_board() -> None:
    board = shared_board(2)
    with MultiSyncCollector(
        board_makers(board),
        None,
        frames_per_batch=FRAMES_PER_BATCH,
        cat_results="stack",
        restart_dead_workers=True,
    ) as collector:
        collector.next()
        os.kill(collector.pool.pids[0], signal.SIGKILL)
        at_kill = board.clone()
        [collector.next() for _ in range(2)]
        restarts = [worker["restarts"] for worker in collector.stats()["per_worker"]]
        board[PARENT_SLOT] = MARK  # after the restart
        last = [collector.next() for _ in range(2)][-1]
    assert restarts == [1, 0]
    fresh = boards_by_worker(last, 0)
    # The fresh worker tallies on in the shared board (not in a copy of its own) ...
    assert (fresh[:, 0] > at_kill[0]).all(), (fresh, at_kill)
    assert board[0] >= fresh[:, 0].max(), (board, fresh)
    # ... and sees what this process writes there after it started.
    assert (fresh[:, PARENT_SLOT] == MARK).all(), fresh


def test_the_policy_stays_copied() -> None:
    """A policy in shared memory is no env maker's state: training it here in place reaches
    the workers only through an update, as without shared memory."""
    board = shared_board(2)
    policy = first_action_policy()
    policy.share_memory()
    with MultiSyncCollector(
        board_makers(board), policy, frames_per_batch=FRAMES_PER_BATCH, cat_results="stack"
    ) as collector:
        collector.next()
        with torch.no_grad():
            policy.module.scale.fill_(5.0)
        before_update = [
            float(p.module.scale.detach()) for p in collector.get_distant_attr("policy")
        ]
        collector.update_policy_weights_()
        after_update = [
            float(p.module.scale.detach()) for p in collector.get_distant_attr("policy")
        ]
    assert before_update == [1.0, 1.0]
    assert after_update == [5.0, 5.0]


def test_parallel_env_workers_write_into_one_board() -> None:
    board = shared_board(2)
    env = ParallelEnv(2, board_makers(board))
    try:
        env.rollout(3, break_when_any_done=False)
        board[PARENT_SLOT] = MARK
        rollout = env.rollout(3, break_when_any_done=False)
    finally:
        env.close()
    seen = rollout["next", BOARD]  # [2 workers, 3 steps, 3 slots]
    assert (seen[..., PARENT_SLOT] == MARK).all(), seen
    assert (seen[0, :, 1] >= 4).all(), seen  # the first rollout's reset and 3 steps
    assert (seen[1, :, 0] >= 4).all(), seen


def test_workers_update_one_set_of_vecnorm_statistics_as_torchrls() -> None:
    """TorchRL's `VecNormV2(shared_data=...)` in a maker: every worker's env counts its
    observations in the statistics this process holds, on TorchRL's collector and on ours."""
    request = {"frames_per_batch": 40, "batches": 2}
    theirs = run_torchrl_side("shared_statistics", request)
    ours = count_in_shared_statistics(MultiSyncCollector, **request)
    assert ours["frames"] == theirs["frames"] == 80
    # 80 steps and the resets that began each worker's 5-step episodes, counted in one place.
    assert theirs["count"] > theirs["frames"]
    assert ours["count"] == theirs["count"]


def test_async_batched_env_workers_write_into_one_board() -> None:
    """`AsyncBatchedCollector`'s env workers are `MultiAsyncCollector`'s: shared there too."""
    board = shared_board(2)
    collector = AsyncBatchedCollector(
        board_makers(board),
        policy=first_action_policy(),
        frames_per_batch=8,
        total_frames=64,
        env_backend="multiprocessing",
    )
    try:
        batches = iter(collector)
        next(batches)
        board[PARENT_SLOT] = MARK
        *_, last = batches
    finally:
        collector.shutdown()
    final = last["next", BOARD].reshape(-1, 3)[-1]  # what the last frame's env read
    assert final[PARENT_SLOT] == MARK, final
    assert (final[:PARENT_SLOT] > 0).all(), final  # both workers' tallies, read by one
    assert (board[:PARENT_SLOT] >= final[:PARENT_SLOT]).all(), (board, final)

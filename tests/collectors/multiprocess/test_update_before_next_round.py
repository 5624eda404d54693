"""A weight update never waits behind a batch in flight; it goes before the workers' next one.

Every worker is held in the middle of a batch (its env waits on a gate file); the update must
return while they are still held (before, it waited for the batch: for the pool's lock a
`MultiSyncCollector` round held, or for the acknowledgement a busy worker sends only after its
batch), and the workers' next batch must run the new weights. TorchRL's `DistributedCollector`
updates a node's collector from a thread of its own while the node collects.
"""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from rlcollect.collectors import MultiAsyncCollector, MultiSyncCollector
from tests.collectors.multiprocess.gated_env import GatedCountingEnv, mark_policy

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]
WORKERS = 2
STEPS = 8  # per worker and batch
# Bounds on waits that end much sooner when the feature works (a busy machine is slow).
HELD_WITHIN = 60.0
UPDATE_WITHIN = 60.0


def marks(batch: Any) -> set[float]:
    return set(batch["mark"].flatten().tolist())


def wait_until_held(tmp_path: Path, count: int) -> None:
    """Until `count` workers wait at the gate."""
    deadline = time.monotonic() + HELD_WITHIN
    while len(list(tmp_path.glob("blocked-*"))) < count:
        assert time.monotonic() < deadline, "the workers never reached the gate"
        time.sleep(0.05)


def update_while_held(collector: Any, policy: Any, gate: Path) -> None:
    """Update the weights (mark 1) from a thread of its own; it must return while the gate is
    closed. The gate is opened afterwards, whatever happened."""
    with torch.no_grad():
        policy.module.weight.fill_(1.0)
    failures: list[BaseException] = []

    def update() -> None:
        try:
            collector.update_policy_weights_()
        except BaseException as error:  # reported below
            failures.append(error)

    updater = threading.Thread(target=update)
    updater.start()
    updater.join(UPDATE_WITHIN)
    returned_while_held = not updater.is_alive()
    gate.unlink()
    updater.join()
    assert not failures, failures
    assert returned_while_held, "update_policy_weights_ waited for the batches in flight"


def gated_makers(tmp_path: Path) -> tuple[Path, list[Any]]:
    """A closed gate, and env makers whose envs collect one batch, then wait at it."""
    gate = tmp_path / "gate"
    gate.touch()
    return gate, [functools.partial(GatedCountingEnv, str(gate), STEPS)] * WORKERS


def test_multisync_update_from_another_thread_mid_round_goes_before_the_next(
    tmp_path: Path,
) -> None:
    policy = mark_policy(0.0)
    gate, makers = gated_makers(tmp_path)
    collector = MultiSyncCollector(
        makers, policy, frames_per_batch=STEPS * WORKERS, total_frames=-1
    )
    try:
        assert marks(collector.next()) == {0.0}
        rounds: list[Any] = []
        collecting = threading.Thread(target=lambda: rounds.append(collector.next()))
        collecting.start()
        try:
            wait_until_held(tmp_path, WORKERS)
            update_while_held(collector, policy, gate)
        finally:
            gate.unlink(missing_ok=True)
            collecting.join()
        assert marks(rounds[0]) == {0.0}  # in flight at the update: the old weights
        assert marks(collector.next()) == {1.0}  # the next round: the new ones
        assert collector.policy_version == 1
    finally:
        collector.shutdown()


def test_multiasync_update_between_batches_does_not_wait_for_those_in_flight(
    tmp_path: Path,
) -> None:
    """Between two `next()` calls the worker that handed in the last batch is collecting its
    next one already (the other may be done, its batch waiting here)."""
    policy = mark_policy(0.0)
    gate, makers = gated_makers(tmp_path)
    collector = MultiAsyncCollector(
        makers, policy, frames_per_batch=STEPS, total_frames=-1, track_worker_id=True
    )
    try:
        assert marks(collector.next()) == {0.0}
        try:
            wait_until_held(tmp_path, 1)
            update_while_held(collector, policy, gate)
        finally:
            gate.unlink(missing_ok=True)
        # Each worker hands in the batch begun before the update (old weights), then runs the
        # new ones.
        seen: dict[int, list[set[float]]] = {index: [] for index in range(WORKERS)}
        while any(len(batches) < 2 for batches in seen.values()):
            batch = collector.next()
            seen[int(batch["collector", "worker_id"][0])].append(marks(batch))
        for batches in seen.values():
            assert batches[0] == {0.0}, seen
            assert all(batch == {1.0} for batch in batches[1:]), seen
    finally:
        collector.shutdown()

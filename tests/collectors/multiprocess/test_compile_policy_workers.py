"""`compile_policy` in the workers of every multi-process collector class: each worker
compiles the policy (a recording backend says which process compiled, and that every step of
every worker ran the compiled graph), and its batches equal an eager collector's (same
seed, deterministic policy). The compile backends here are `torch.compile`'s cheap ones (a
recording backend, "aot_eager"): inductor compiles for minutes on this machine's shared CPUs;
which backend runs is `torch.compile`'s business, that the workers compile is ours."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlcollect.collectors import AsyncCollector, MultiAsyncCollector, MultiSyncCollector
from rlcollect.envs import GymEnv
from tests.collectors.multiprocess.frontends_side import RecordingBackend
from tests.collectors.policies import greedy_module
from tests.collectors.single.torchrl_parity import assert_same_batches

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]
FRAMES = 20  # a worker's batch
SEED = 5


def cartpole() -> GymEnv:
    return GymEnv("CartPole-v1")


def collect(collector_class: type, workers: int, **options: Any) -> dict[int, list[Any]]:
    """Each worker's batches, in order, by its pid (a MultiSync batch: a row a worker)."""
    makers = cartpole if collector_class is AsyncCollector else [cartpole] * workers
    is_async = collector_class is not MultiSyncCollector
    with collector_class(
        makers,
        greedy_module(),
        frames_per_batch=FRAMES if is_async else FRAMES * workers,
        total_frames=FRAMES * workers * 2,
        **({"track_worker_id": True} if is_async else {"cat_results": "stack"}),
        **options,
    ) as collector:
        collector.set_seed(SEED)
        batches = list(collector)
        pids = collector.pool.pids
    by_pid: dict[int, list[Any]] = {pid: [] for pid in pids}
    for batch in batches:
        if not is_async:
            for worker, pid in enumerate(pids):
                by_pid[pid].append(batch[worker])
            continue
        # Async workers answer in any order (one may deliver more batches than another).
        worker = int(batch["collector", "worker_id"].flatten()[0])
        by_pid[pids[worker]].append(batch.exclude(("collector", "worker_id")))
    return by_pid


def assert_same_per_worker(ours: dict[int, list[Any]], eager: dict[int, list[Any]]) -> None:
    """Worker i's k-th batch equals the eager worker i's (each worker is seeded alike)."""
    for mine, reference in zip(ours.values(), eager.values(), strict=True):
        common = min(len(mine), len(reference))
        assert common >= 1
        assert_same_batches(mine[:common], reference[:common])


@pytest.mark.parametrize(
    ("collector_class", "workers"),
    [(MultiSyncCollector, 2), (MultiAsyncCollector, 2), (AsyncCollector, 1)],
)
def test_every_worker_steps_the_compiled_policy_and_matches_eager(
    collector_class: type, workers: int, tmp_path: Path
) -> None:
    backend = RecordingBackend(tmp_path)
    compiled = collect(collector_class, workers, compile_policy={"backend": backend})
    eager = collect(collector_class, workers)
    assert backend.graph_pids() == set(compiled)  # each worker compiled; this process did not
    calls = backend.calls()
    for pid, batches in compiled.items():
        delivered = sum(batch.numel() for batch in batches)
        if collector_class is MultiSyncCollector:
            assert calls[pid] == delivered == 2 * FRAMES  # every step ran the compiled graph
        else:  # an async worker may have begun its next batch when the collector stopped
            assert calls[pid] >= delivered > 0
    assert_same_per_worker(compiled, eager)


def test_aot_eager_compiled_workers_match_eager() -> None:
    compiled = collect(MultiSyncCollector, 2, compile_policy={"backend": "aot_eager"})
    assert_same_per_worker(compiled, collect(MultiSyncCollector, 2))

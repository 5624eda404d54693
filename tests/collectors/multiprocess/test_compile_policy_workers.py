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
from tensordict import TensorDictBase

from rlcollect.collectors import AsyncCollector, MultiAsyncCollector, MultiSyncCollector
from rlcollect.envs import GymEnv
from tests.collectors.multiprocess.frontends_side import RecordingBackend
from tests.collectors.policies import greedy_module
from tests.collectors.single.test_torchrl_parity import assert_same_batches

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]
FRAMES = 20  # a worker's batch
SEED = 5


def cartpole() -> GymEnv:
    return GymEnv("CartPole-v1")


def collect(collector_class: type, workers: int, **options: Any) -> tuple[list[Any], list[int]]:
    """Two batches of each worker (in worker order), and the workers' pids."""
    makers = cartpole if collector_class is AsyncCollector else [cartpole] * workers
    is_async = collector_class is not MultiSyncCollector
    with collector_class(
        makers,
        greedy_module(),
        frames_per_batch=FRAMES if is_async else FRAMES * workers,
        total_frames=FRAMES * workers * 2,
        **({"track_worker_id": True} if is_async else {}),
        **options,
    ) as collector:
        collector.set_seed(SEED)
        batches = list(collector)
        pids = collector.pool.pids
    if is_async:  # the order in which workers answer varies: group by worker
        batches.sort(key=lambda batch: int(batch["collector", "worker_id"].flatten()[0]))
    return batches, pids


def without_worker_ids(batches: list[TensorDictBase]) -> list[TensorDictBase]:
    return [batch.exclude(("collector", "worker_id")) for batch in batches]


@pytest.mark.parametrize(
    ("collector_class", "workers"),
    [(MultiSyncCollector, 2), (MultiAsyncCollector, 2), (AsyncCollector, 1)],
)
def test_every_worker_steps_the_compiled_policy_and_matches_eager(
    collector_class: type, workers: int, tmp_path: Path
) -> None:
    backend = RecordingBackend(tmp_path)
    compiled, pids = collect(collector_class, workers, compile_policy={"backend": backend})
    eager, _ = collect(collector_class, workers)
    assert backend.graph_pids() == set(pids)  # each worker compiled; this process did not
    # Every step of every worker ran the compiled graph (batches of FRAMES steps, two each).
    assert backend.calls() == dict.fromkeys(pids, 2 * FRAMES)
    assert_same_batches(without_worker_ids(compiled), without_worker_ids(eager))


def test_aot_eager_compiled_workers_match_eager() -> None:
    compiled, _ = collect(MultiSyncCollector, 2, compile_policy={"backend": "aot_eager"})
    eager, _ = collect(MultiSyncCollector, 2)
    assert_same_batches(compiled, eager)

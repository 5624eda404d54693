"""`compile_policy` through a RayCollector's `collector_kwargs` (as TorchRL's RayCollector
passes it on): every actor's collector steps the compiled policy, and its batches equal an
eager RayCollector's (same seed, deterministic policy). A recording backend names the
processes that compiled and counts the compiled calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlcollect.collectors import RayCollector
from tests.collectors.multiprocess.frontends_side import RecordingBackend
from tests.collectors.policies import greedy_module
from tests.collectors.ray.helpers import RAY_TEST_TIMEOUT
from tests.collectors.single.torchrl_parity import assert_same_batches

pytest.importorskip("ray")

pytestmark = [
    pytest.mark.timeout(RAY_TEST_TIMEOUT),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]
FRAMES = 20  # an actor's batch


def collect(**collector_kwargs: Any) -> tuple[list[Any], list[int]]:
    """Two batches of two actors, and the actors' pids."""
    with RayCollector(
        "CartPole-v1",
        greedy_module(),
        num_collectors=2,
        frames_per_batch=2 * FRAMES,
        total_frames=4 * FRAMES,
        collector_kwargs=collector_kwargs,
    ) as collector:
        collector.set_seed(7)
        batches = list(collector)
        pids = collector.process_ids()
    return batches, pids


def test_every_actor_steps_the_compiled_policy_and_matches_eager(tmp_path: Path) -> None:
    backend = RecordingBackend(tmp_path)
    compiled, pids = collect(compile_policy={"backend": backend})
    eager, _ = collect()
    assert backend.graph_pids() == set(pids)
    assert backend.calls() == dict.fromkeys(pids, 2 * FRAMES)
    assert_same_batches(compiled, eager)

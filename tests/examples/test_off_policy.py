"""examples/common/off_policy.py: the throttle holds a real background collector at the
learner's limit, and the pacer owes updates at the configured ratio."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from types import ModuleType

import pytest

from rlcollect.collectors import Collector
from rlcollect.envs import GymEnv
from rlcollect.replay import LazyTensorStorage, ReplayBuffer
from tests.examples.script_runner import EXAMPLES


@pytest.fixture(scope="module")
def off_policy() -> Iterator[ModuleType]:
    sys.path.insert(0, str(EXAMPLES))
    try:
        from common import off_policy

        yield off_policy
    finally:
        sys.path.remove(str(EXAMPLES))


def wait_for_frames(collector: Collector, frames: int) -> None:
    deadline = time.monotonic() + 60
    while collector.frames < frames:
        assert time.monotonic() < deadline, f"the collector stopped at {collector.frames}"
        time.sleep(0.01)


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children")
def test_throttle_holds_the_background_collector_at_the_learners_limit(
    off_policy: ModuleType,
) -> None:
    throttle = off_policy.CollectionThrottle(frames_ahead=100)
    buffer = ReplayBuffer(storage=LazyTensorStorage(1000), batch_size=8)
    collector = Collector(
        GymEnv("Pendulum-v1"),
        None,
        frames_per_batch=50,
        total_frames=1000,
        replay_buffer=buffer,
        pre_collect_hook=throttle,
    )
    throttle.watch(collector, buffer)
    collector.start()
    try:
        wait_for_frames(collector, 100)
        time.sleep(0.3)  # had it not been held, it would go on to 1000 meanwhile
        assert collector.frames == 100
        assert throttle.stored == (100, 100), "both batches are written"
        throttle.allow(120)  # trained on 120 frames: up to 220, whole batches below it
        wait_for_frames(collector, 250)
        time.sleep(0.3)
        assert collector.frames == 250
        throttle.open()
        wait_for_frames(collector, 1000)
    finally:
        throttle.open()
        collector.async_shutdown()
    assert len(buffer) == 1000


def test_pacer_owes_updates_at_the_ratio_from_learning_starts(off_policy: ModuleType) -> None:
    pacer = off_policy.UpdatePacer(updates_per_frame=1 / 3, learning_starts=100)
    assert pacer.lag(frames=50, updates=0, buffer_size=50) == 0
    # first seen at 160 frames: anchored where the buffer crossed 100
    assert pacer.lag(frames=160, updates=0, buffer_size=160) == 20
    assert pacer.lag(frames=400, updates=20, buffer_size=400) == 80  # 300 frames / 3
    assert pacer.lag(frames=400, updates=100, buffer_size=400) == 0


def test_rows_stay_on_the_grid_whatever_the_collector_added_before_the_learner_looked(
    off_policy: ModuleType,
) -> None:
    # The collector thread may finish a batch between `start()` and the learner's first read of
    # its count; the first row is still due at the first grid point (a seed's run logs the same
    # rows on a busy machine, as tests/examples/test_sac.py checks end to end).
    assert [off_policy.next_row_at(frames, 200) for frames in (0, 50, 150)] == [200] * 3
    assert off_policy.next_row_at(199, 200) == 200
    assert off_policy.next_row_at(200, 200) == 400
    assert off_policy.next_row_at(800, 200) == 1000, "a resumed run keeps the grid"

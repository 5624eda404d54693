"""The collectors whose loops run in children refuse to fill a rollout in place, saying why and
what to use instead (`Collector.collect` runs its loop over the rollout in this process)."""

from __future__ import annotations

import pytest

from rlcollect.collectors import MultiAsyncCollector, MultiSyncCollector, RayCollector
from rlcollect.collectors.children import CollectorWithChildren
from rlcollect.errors import MisuseError
from rlcollect.replay import RolloutBuffer
from rlcollect.testing import CountingEnv

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]


def batched_counting_env() -> CountingEnv:
    return CountingEnv(episode_length=5, batch_size=(2,))


@pytest.mark.parametrize("collector_class", [MultiSyncCollector, MultiAsyncCollector])
def test_multi_process_collectors_refuse_collect_naming_the_alternative(
    collector_class: type,
) -> None:
    rollout = RolloutBuffer(2, 4, 1, 1).start_rollout()
    with collector_class(batched_counting_env, num_workers=1, frames_per_batch=8) as collector:
        with pytest.raises(MisuseError, match=r"runs its loops in its children.*Collector\(Par"):
            collector.collect(num_steps=4, rollout=rollout)
        with pytest.raises(MisuseError, match=r"collect_rollout\(rollout\) is not available"):
            collector.collect_rollout(rollout)
        assert collector.next() is not None, "and the collector goes on"
    assert not rollout["obs"].any()


def test_the_ray_collector_refuses_the_same_way() -> None:
    assert RayCollector.collect is CollectorWithChildren.collect
    assert RayCollector.collect_rollout is CollectorWithChildren.collect_rollout

"""RayCollector with each collector class in its actors, as TorchRL's hands them env makers.

TorchRL's `RayCollector` gives any class but the single `Collector` a list of env makers, one
per worker: `num_workers_per_collector` copies of the actor's maker (1 by default). Ours does
the same, so `collector_class=MultiSyncCollector` / `MultiAsyncCollector` run without
`num_workers`; `num_workers` given to the class (a `functools.partial`, `collector_kwargs`)
still works as before. Batches have the layout of TorchRL's, side by side on the same
cluster.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

import rlcollect.collectors
from rlcollect import keys
from tests.collectors.ray.helpers import RAY_TEST_TIMEOUT, counting_env

ray = pytest.importorskip("ray")
torchrl_collectors = pytest.importorskip("torchrl.collectors")

pytestmark = [
    pytest.mark.timeout(RAY_TEST_TIMEOUT),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]
CLASSES = ["Collector", "MultiSyncCollector", "MultiAsyncCollector"]


def cartpole() -> Any:
    from torchrl.envs import GymEnv

    return GymEnv("CartPole-v1")


def batch_layouts(owner: str, name: str, **options: Any) -> list[tuple[torch.Size, list[Any]]]:
    """The batch size and dim names of every batch of a RayCollector (ours or TorchRL's)
    running `name` (of the same library) in 2 actors over CartPole."""
    if owner == "rlcollect":
        from rlcollect.collectors import RayCollector
    else:
        from torchrl.collectors.distributed import RayCollector  # type: ignore[no-redef]
    from torchrl.modules import RandomPolicy

    library = rlcollect.collectors if owner == "rlcollect" else torchrl_collectors
    collector = RayCollector(
        [cartpole, cartpole],
        RandomPolicy(cartpole().action_spec),  # TorchRL's multi-process classes need one
        collector_class=getattr(library, name),
        frames_per_batch=40,
        total_frames=80,
        **options,
    )
    try:
        return [(data.batch_size, list(data.names)) for data in collector]
    finally:
        collector.shutdown()


@pytest.mark.parametrize("name", CLASSES)
def test_every_collector_class_runs_in_the_actors(name: str) -> None:
    """Each actor runs the class over its own env; trajectory ids stay unique over actors
    and workers, and every frame is one of the counting env's steps."""
    collector_class = getattr(rlcollect.collectors, name)
    with rlcollect.collectors.RayCollector(
        counting_env(4),
        num_collectors=2,
        collector_class=collector_class,
        frames_per_batch=40,
        total_frames=80,
    ) as collector:
        batches = list(collector)
    assert sum(batch.numel() for batch in batches) == 80
    ids = torch.cat([batch[keys.TRAJ_IDS].flatten() for batch in batches])
    assert len(ids.unique()) == 80 // 4  # episodes of 4 steps, none shared by two actors
    for batch in batches:
        assert batch.names[-1] == "time"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "sync"), [("MultiSyncCollector", True), ("MultiAsyncCollector", False)]
)
def test_batches_have_the_layout_of_torchrl_ray_collectors(name: str, sync: bool) -> None:
    """`sync` given to both: TorchRL's default is False, ours True."""
    ours = batch_layouts("rlcollect", name, sync=sync)
    theirs = batch_layouts("torchrl", name, sync=sync, remote_configs={"num_cpus": 1})
    assert ours == theirs


def test_num_workers_per_collector_gives_every_actor_that_many_workers() -> None:
    with rlcollect.collectors.RayCollector(
        counting_env(4),
        num_collectors=2,
        collector_class=rlcollect.collectors.MultiSyncCollector,
        num_workers_per_collector=2,
        frames_per_batch=40,
        total_frames=40,
    ) as collector:
        (batch,) = list(collector)
    assert batch.batch_size == torch.Size([2, 2, 10])  # actors, their workers, time
    assert len(batch[keys.TRAJ_IDS].unique()) == 2 * 2 * 3  # 3 episodes (4, 4, 2) each


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        (
            {"collector_class": "single", "num_workers_per_collector": 2},
            ValueError,
            r"num_workers_per_collector=2 needs a multi-process collector_class .*Collector runs "
            r"one env per actor",
        ),
        (
            {
                "collector_class": functools.partial(
                    rlcollect.collectors.MultiSyncCollector, num_workers=3
                ),
                "num_workers_per_collector": 2,
            },
            ValueError,
            r"num_workers=3 \(for collector_class\) and num_workers_per_collector=2 disagree",
        ),
        (
            {"collector_class": "sync", "num_workers_per_collector": 0},
            ValueError,
            r"num_workers_per_collector=0 must be at least 1",
        ),
        (
            {"collector_class": "sync", "num_workers_per_collector": 1.5},
            TypeError,
            r"num_workers_per_collector must be an int; got 1.5",
        ),
    ],
)
def test_bad_num_workers_per_collector_is_refused_before_ray_starts_actors(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        rlcollect.collectors.RayCollector(
            counting_env(4), num_collectors=2, frames_per_batch=40, total_frames=40, **options
        )


def test_num_workers_given_to_the_class_still_copies_the_maker_itself() -> None:
    with rlcollect.collectors.RayCollector(
        counting_env(4),
        num_collectors=1,
        collector_class=rlcollect.collectors.MultiSyncCollector,
        collector_kwargs={"num_workers": 2},
        frames_per_batch=20,
        total_frames=20,
    ) as collector:
        (batch,) = list(collector)
    assert batch.batch_size == torch.Size([1, 2, 10])

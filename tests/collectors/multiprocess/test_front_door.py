"""TorchRL's front door: `Collector(..., num_collectors=N, sync=..., backend=...)`,
`MultiCollector(sync=...)` and `AsyncCollector`, side by side with TorchRL's on the same
arguments (TorchRL's CartPole, random actions)."""

from __future__ import annotations

from typing import Any

import pytest

import rlcollect
from rlcollect.collectors import (
    AsyncCollector,
    Collector,
    MultiAsyncCollector,
    MultiCollector,
    MultiSyncCollector,
)
from rlcollect.testing import CountingEnv
from tests.collectors.multiprocess.torchrl_side import describe, run_torchrl, torchrl_cartpole

torchrl_collectors = pytest.importorskip("torchrl.collectors")
torchrl_envs = pytest.importorskip("torchrl.envs")

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]


def first_batch(collector: Any) -> Any:
    try:
        return next(iter(collector))
    finally:
        collector.shutdown()


def compare_with_torchrl(builder: str, makers: int = 0, **arguments: Any) -> dict[str, Any]:
    """Build rlcollect's `builder` and TorchRL's (in a process of its own) with the same
    arguments on TorchRL's CartPole: the same class, workers, frames per worker, and first
    batches of the same shape and keys. Returns ours, described."""
    create_env_fn = [torchrl_cartpole] * makers if makers else torchrl_cartpole
    ours = getattr(rlcollect.collectors, builder)(create_env_fn, **arguments)
    try:
        mine = describe(ours, MultiCollector)
    finally:
        ours.shutdown()
    theirs = run_torchrl(builder, makers, **arguments)
    assert mine == theirs  # MultiAsync's batches too: ("collector", "worker_id") is opt-in
    return mine


@pytest.mark.parametrize(
    ("selectors", "expected"),
    [
        ({"num_collectors": 2}, MultiAsyncCollector),  # TorchRL's default: sync=False
        ({"num_collectors": 2, "sync": True}, MultiSyncCollector),
        ({"num_collectors": 1, "backend": "process", "sync": False}, MultiAsyncCollector),
    ],
)
def test_collector_with_num_collectors_is_torchrls_multi_process_collector(
    selectors: dict[str, Any], expected: type
) -> None:
    ours = compare_with_torchrl("Collector", frames_per_batch=20, total_frames=40, **selectors)
    assert ours["class"] == expected.__name__


def test_a_list_of_env_makers_gives_one_worker_each_and_backend_options_are_merged() -> None:
    ours = compare_with_torchrl(
        "Collector",
        makers=3,
        backend="process",
        sync=True,
        backend_options={"cat_results": -1},
        frames_per_batch=30,
        total_frames=30,
    )
    assert ours["num_workers"] == 3
    assert ours["batch_size"] == [30]  # concatenated along time, as cat_results=-1 asks


def test_multi_collector_dispatches_on_sync_and_covers_both_classes() -> None:
    for sync, expected in ((True, MultiSyncCollector), (False, MultiAsyncCollector)):
        ours = compare_with_torchrl(
            "MultiCollector", num_workers=2, frames_per_batch=20, total_frames=20, sync=sync
        )
        assert ours["class"] == expected.__name__
        assert ours["is_multi_collector"]


def test_async_collector_collects_one_env_in_one_background_process() -> None:
    ours = compare_with_torchrl("AsyncCollector", frames_per_batch=20, total_frames=40)
    assert ours["num_workers"] == 1
    collector = AsyncCollector(torchrl_cartpole, frames_per_batch=20)
    try:
        assert len(collector.process_ids()) == 1
    finally:
        collector.shutdown()


def test_direct_backend_builds_a_collector_here_from_one_maker_or_a_list_of_one() -> None:
    for create_env_fn in (torchrl_cartpole, [torchrl_cartpole]):
        for selectors in ({}, {"backend": "direct"}, {"backend": "direct", "num_collectors": 1}):
            ours = Collector(create_env_fn, frames_per_batch=10, total_frames=10, **selectors)
            theirs = torchrl_collectors.Collector(
                create_env_fn, frames_per_batch=10, total_frames=10, **selectors
            )
            assert type(ours) is Collector
            assert type(theirs) is torchrl_collectors.Collector
            assert first_batch(ours).batch_size == first_batch(theirs).batch_size


# --- refusals (TorchRL refuses the same calls) ----------------------------------------------------


class OwnCollector(Collector):
    pass


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: Collector(CountingEnv(), frames_per_batch=4, backend="rpc"), ValueError,
         r"no backend='rpc'; use one of \['direct', 'process', 'ray'\] \(TorchRL's"),
        (lambda: Collector(CountingEnv(), frames_per_batch=4, backend="direct",
                           num_collectors=2), ValueError, r"got num_collectors=2"),
        (lambda: Collector(CountingEnv(), frames_per_batch=4, sync=True, backend="direct"),
         ValueError, r"sync is for backend='process' or 'ray'"),
        (lambda: Collector(CountingEnv(), frames_per_batch=4, backend_options={"a": 1}),
         ValueError, r"backend_options \['a'\] are for backend='process'"),
        (lambda: Collector(CountingEnv, frames_per_batch=4, num_collectors=2,
                           backend_options={"frames_per_batch": 8}), ValueError,
         r"backend_options repeats \['frames_per_batch'\]"),
        (lambda: Collector(CountingEnv, frames_per_batch=4, num_collectors=2,
                           backend_options={"num_workers": 2}), ValueError,
         r"backend_options holds the selector arguments \['num_workers'\]"),
        (lambda: Collector(CountingEnv, frames_per_batch=4, num_collectors=0), ValueError,
         r"num_collectors=0 must be at least 1"),
        (lambda: Collector(CountingEnv, frames_per_batch=4, num_collectors=True), TypeError,
         r"num_collectors must be a positive int; got True"),
        (lambda: Collector([CountingEnv, CountingEnv], frames_per_batch=4, num_collectors=3),
         ValueError, r"num_collectors=3 but create_env_fn lists 2 env makers"),
        (lambda: Collector([CountingEnv, CountingEnv], frames_per_batch=4), ValueError,
         r"create_env_fn lists 2\. Pass num_collectors=2"),
        (lambda: OwnCollector(CountingEnv(), frames_per_batch=4, num_collectors=2), TypeError,
         r"\['num_collectors'\] select a backend only when Collector itself is built"),
        (lambda: MultiCollector(CountingEnv, num_workers=2, frames_per_batch=4), TypeError,
         r"MultiCollector needs sync=True \(MultiSyncCollector\) or sync=False"),
        (lambda: AsyncCollector([CountingEnv, CountingEnv], frames_per_batch=4), TypeError,
         r"AsyncCollector collects one env; got a list of 2 env makers"),
    ],
)  # fmt: skip
def test_front_door_refusals_name_the_argument(call: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call()


def test_a_subclass_of_collector_stays_in_this_process() -> None:
    collector = OwnCollector(CountingEnv(), frames_per_batch=4, total_frames=4)
    assert type(collector) is OwnCollector
    assert first_batch(collector).batch_size == (4,)


def test_one_class_for_both_import_paths() -> None:
    assert rlcollect.Collector is rlcollect.collectors.Collector
    assert rlcollect.MultiCollector is MultiCollector
    assert rlcollect.AsyncCollector is AsyncCollector
    assert {"AsyncCollector", "MultiCollector"} <= set(rlcollect.__all__)
    assert {"AsyncCollector", "MultiCollector"} <= set(rlcollect.collectors.__all__)

"""TorchRL's `compiled_policy` / `compiled_policy_kwargs` (and the CUDA-graph pair) on every
collector class that takes `compile_policy`, side by side with TorchRL's: a bool saying
whether it was asked, and the dict given (else `{}`). TorchRL's multi-process collectors are
built in a process of their own (tests/collectors/multiprocess/frontends_side.py)."""

from __future__ import annotations

from typing import Any

import pytest

from rlcollect.collectors import (
    AsyncCollector,
    Collector,
    MultiAsyncCollector,
    MultiSyncCollector,
)
from tests.collectors.multiprocess.frontends_side import (
    compile_attributes,
    counted_cartpole,
    run_torchrl_side,
)

torchrl_collectors = pytest.importorskip("torchrl.collectors")

pytestmark = pytest.mark.timeout(240)
OPTIONS: list[Any] = [None, False, True, {"backend": "eager", "warmup": 2}]


def expected(compile_policy: Any) -> dict[str, Any]:
    return {
        "compiled_policy": compile_policy not in (None, False),
        "compiled_policy_kwargs": compile_policy if isinstance(compile_policy, dict) else {},
        "cudagraphed_policy": False,
        "cudagraphed_policy_kwargs": {},
    }


@pytest.mark.parametrize("compile_policy", OPTIONS)
def test_single_collector_says_what_was_asked_as_torchrls(compile_policy: Any) -> None:
    options = {"frames_per_batch": 10, "total_frames": 10, "compile_policy": compile_policy}
    ours = Collector(counted_cartpole(), None, **options)
    theirs = torchrl_collectors.Collector(counted_cartpole(), None, **options)
    try:
        assert compile_attributes(ours) == compile_attributes(theirs) == expected(compile_policy)
        if isinstance(compile_policy, dict):  # the dict given, as TorchRL keeps it
            assert ours.compiled_policy_kwargs is compile_policy
    finally:
        ours.shutdown()
        theirs.shutdown()


def test_cudagraph_attributes_say_what_was_asked_without_cuda() -> None:
    with pytest.warns(UserWarning, match="needs CUDA"):
        ours = Collector(
            counted_cartpole(), None, frames_per_batch=10, cudagraph_policy={"warmup": 3}
        )
    try:
        assert ours.cudagraphed_policy is True
        assert ours.cudagraphed_policy_kwargs == {"warmup": 3}
    finally:
        ours.shutdown()


@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
@pytest.mark.parametrize(
    ("collector_class", "compile_policy"),
    [
        (MultiSyncCollector, {"backend": "eager"}),
        (MultiSyncCollector, None),
        (MultiAsyncCollector, True),
    ],
)
def test_multi_collectors_say_what_was_asked_as_torchrls(
    collector_class: type, compile_policy: Any
) -> None:
    # True compiles with inductor in the workers at the first batch: none is collected here.
    with collector_class(
        [counted_cartpole] * 2,
        None,
        frames_per_batch=20,
        total_frames=20,
        compile_policy=compile_policy,
    ) as collector:
        ours = compile_attributes(collector)
    theirs = run_torchrl_side(
        "compile", {"builder": collector_class.__name__, "compile_policy": compile_policy}
    )
    assert ours == theirs == expected(compile_policy)


@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
def test_async_collector_front_door_says_what_was_asked() -> None:
    with AsyncCollector(
        counted_cartpole, None, frames_per_batch=10, compile_policy={"backend": "eager"}
    ) as collector:
        assert compile_attributes(collector) == expected({"backend": "eager"})


@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
def test_a_bad_compile_policy_is_refused_before_any_worker_starts() -> None:
    with pytest.raises(TypeError, match=r"compile_policy must be True, False, None or a dict"):
        MultiSyncCollector(
            [counted_cartpole] * 2, None, frames_per_batch=20, compile_policy="inductor"
        )

"""In a process of a torch.distributed group (a node of TorchRL's `DistributedCollector`, whose
launcher asks for the node's status within 10 s) the constructor returns once the workers are
started, not once they have built their collectors; a worker that fails to build raises at the
first call that needs it. Elsewhere the constructor still waits (and raises)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlcollect.collectors import MultiAsyncCollector, MultiSyncCollector
from tests.collectors.multiprocess.gated_env import broken_env_maker, counting_env_after_gate

dist = pytest.importorskip("torch.distributed")

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]
BUILT_WITHIN = 60.0  # a bound; the constructor returns at once when the feature works


@pytest.fixture
def process_group(tmp_path: Path) -> Iterator[None]:
    """This process as the one member of a gloo group (what a node of a launcher is)."""
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'group'}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("process_group")
@pytest.mark.parametrize("collector_class", [MultiSyncCollector, MultiAsyncCollector])
def test_the_constructor_returns_before_the_workers_have_built(
    tmp_path: Path, collector_class: type
) -> None:
    gate = tmp_path / "gate"
    gate.touch()
    maker = functools.partial(counting_env_after_gate, str(gate))
    built: list[object] = []
    constructing = threading.Thread(
        target=lambda: built.append(
            collector_class([maker, maker], None, frames_per_batch=10, total_frames=20)
        )
    )
    constructing.start()
    constructing.join(BUILT_WITHIN)
    returned_while_held = not constructing.is_alive()
    gate.unlink()
    constructing.join()
    collector = built[0]
    try:
        assert returned_while_held, "the constructor waited for the workers to build"
        assert sum(batch.numel() for batch in collector) == 20  # type: ignore[attr-defined]
    finally:
        collector.shutdown()  # type: ignore[attr-defined]


@pytest.mark.usefixtures("process_group")
def test_a_worker_that_fails_to_build_raises_at_the_first_batch() -> None:
    collector = MultiSyncCollector([broken_env_maker], None, frames_per_batch=10)
    try:
        with pytest.raises(OSError, match=r"worker 0 failed: .*raised OSError: no display"):
            collector.next()
    finally:
        collector.shutdown()

"""RayWeightSyncScheme's promises on a real local Ray cluster: one object-store copy per update,
no aliasing, batch boundaries only, acknowledged or named, bad weights refused, the cascade."""

from __future__ import annotations

import functools
import queue
import time
from typing import Any

import pytest
import torch

from rlcollect import keys
from rlcollect.collectors import (
    ActorTimeoutError,
    MultiSyncCollector,
    NoWeightSyncScheme,
    RayCollector,
)
from rlcollect.errors import MisuseError
from tests.collectors.policies import BiasPolicy, bias_module
from tests.collectors.ray.helpers import RAY_TEST_TIMEOUT, REPORT_SECONDS
from tests.conftest import processes_gone

ray = pytest.importorskip("ray")

pytestmark = [
    pytest.mark.timeout(RAY_TEST_TIMEOUT),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]
PENDULUM = "Pendulum-v1"
VERSION = ("next", keys.POLICY_VERSION)


def set_bias(policy: torch.nn.Module, value: float) -> None:
    with torch.no_grad():
        policy.module.bias.fill_(value)


def assert_acted_with(batch: Any, bias: float, version: int) -> None:
    assert torch.all(batch["action"] == bias), batch["action"].unique()
    assert torch.all(batch[VERSION] == version), batch[VERSION].unique()


class CountingPuts:
    """Counts `ray.put` calls (and lets them through): what an update stores in Ray."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        put = ray.put

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return put(*args, **kwargs)

        monkeypatch.setattr(ray, "put", counted)


def test_weights_are_put_once_per_update_and_never_alias_the_trainers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy = bias_module(0.5)
    with RayCollector(
        PENDULUM, policy, num_collectors=2, frames_per_batch=20, track_policy_version=True
    ) as collector:
        assert_acted_with(collector.next(), 0.5, 0)
        set_bias(policy, 1.5)  # an optimiser step in place: no actor sees it without an update
        assert_acted_with(collector.next(), 0.5, 0)
        puts = CountingPuts(monkeypatch)
        collector.update_policy_weights_()
        assert puts.calls == 1, "one object-store copy for both actors"
        set_bias(policy, 2.0)  # after the update: must not leak into the actors' copies
        assert_acted_with(collector.next(), 1.5, 1)
        collector.update_policy_weights_(weights={"module.bias": torch.tensor([0.25])})
        assert_acted_with(collector.next(), 0.25, 2)
        versions = [actor["policy_version"] for actor in collector.stats()["collectors"]]
        assert versions == [2, 2]
        assert collector.policy_version == 2


def test_bad_weights_are_refused_before_anything_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = bias_module(0.5)
    cases = [
        ({"module.bias": torch.zeros(2)}, r"weights\['module.bias'\] has shape \(2,\)"),
        ({"module.bias": torch.zeros(1, dtype=torch.float64)}, r"dtype torch.float64"),
        ({"module.weight": torch.zeros(1)}, r"missing keys \['module.bias'\]"),
    ]
    with RayCollector(
        PENDULUM, policy, num_collectors=2, frames_per_batch=20, track_policy_version=True
    ) as collector:
        puts = CountingPuts(monkeypatch)
        for weights, match in cases:
            with pytest.raises(ValueError, match=match):
                collector.update_policy_weights_(weights=weights)
        with pytest.raises(ValueError, match=r"worker_ids has 5; actors are numbered 0..1"):
            collector.update_policy_weights_(worker_ids=5)
        assert puts.calls == 0, "nothing reached the object store"
        assert collector.policy_version == 0
        assert_acted_with(collector.next(), 0.5, 0)


def test_one_update_at_the_top_reaches_every_worker_of_every_actor() -> None:
    policy = bias_module(0.5)
    inner = functools.partial(MultiSyncCollector, num_workers=2)
    with RayCollector(
        PENDULUM,
        policy,
        num_collectors=2,
        frames_per_batch=40,
        collector_class=inner,
        track_policy_version=True,
    ) as collector:
        first = collector.next()
        assert first.batch_size == torch.Size([2, 2, 10])
        assert_acted_with(first, 0.5, 0)
        set_bias(policy, 1.5)
        collector.update_policy_weights_()
        assert_acted_with(collector.next(), 1.5, 1)  # every leaf, at its next batch
        leaves = [
            worker["policy_version"]
            for actor in collector.stats()["collectors"]
            for worker in actor["collector"]["per_worker"]
        ]
        assert leaves == [1, 1, 1, 1]
        pids = collector.process_ids()
    assert len(set(pids)) == 6, "2 actors and their 2 workers each"
    assert processes_gone(pids, 15), "shutdown() ends the actors and their workers"


def test_an_actor_that_never_acknowledges_is_named_within_the_timeout() -> None:
    policy = bias_module(0.5)
    collector = RayCollector(PENDULUM, policy, num_collectors=2, frames_per_batch=20)
    collector.next()
    pids = collector.process_ids()
    hang = {"module.bias": torch.tensor([BiasPolicy.HANG_BIAS])}
    start = time.monotonic()
    with pytest.raises(
        ActorTimeoutError, match=r"collector actor 1 failed: apply_weights\(\) did not answer"
    ):
        collector.update_policy_weights_(weights=hang, worker_ids=1, timeout=2)
    assert time.monotonic() - start < 2 + REPORT_SECONDS
    with pytest.raises(MisuseError, match=r"shut down"):
        collector.next()
    assert processes_gone(pids, 15), "the hung actor was ended, and the other one"


@pytest.mark.parametrize(
    "options",
    [{"sync": False, "update_after_each_batch": True}, {"max_weight_update_interval": 1}],
    ids=["async, after each batch", "sync, every other batch"],
)
def test_overdue_actors_get_the_latest_weights_before_their_next_batch(
    options: dict[str, Any],
) -> None:
    policy = bias_module(0.5)
    with RayCollector(
        PENDULUM,
        policy,
        num_collectors=2,
        frames_per_batch=20,
        track_policy_version=True,
        **options,
    ) as collector:
        collector.next()
        set_bias(policy, -0.5)
        # A batch already in flight (async) or not yet overdue (sync) keeps the old weights.
        batches = [collector.next() for _ in range(4)]
    assert torch.all(batches[-1]["action"] == -0.5)
    assert int(batches[-1][VERSION].min()) >= 1
    for batch in batches:  # weights change between batches only: one version per actor's batch
        rows = batch[VERSION].reshape(len(batch) if batch.ndim > 1 else 1, -1)
        assert (rows == rows[:, :1]).all(), rows


def test_no_weight_sync_scheme_keeps_the_first_weights() -> None:
    policy = bias_module(0.5)
    with RayCollector(
        PENDULUM,
        policy,
        num_collectors=1,
        frames_per_batch=10,
        weight_sync_schemes={"policy": NoWeightSyncScheme()},
    ) as collector:
        set_bias(policy, 1.0)
        collector.update_policy_weights_()
        assert torch.all(collector.next()["action"] == 0.5)


class QueueReceiver:
    """A weight receiver (as a parent of the collector would feed it): polled every batch."""

    def __init__(self) -> None:
        self.queue: queue.Queue = queue.Queue()

    def receive(self) -> Any:
        try:
            return self.queue.get_nowait()
        except queue.Empty:
            return None


def test_received_weights_are_sent_to_the_actors() -> None:
    receiver = QueueReceiver()
    with RayCollector(
        PENDULUM,
        bias_module(0.5),
        num_collectors=2,
        frames_per_batch=20,
        weight_recv_schemes={"policy": receiver},
        track_policy_version=True,
    ) as collector:
        receiver.queue.put({"module.bias": torch.tensor([-1.5])})
        assert_acted_with(collector.next(), -1.5, 1)

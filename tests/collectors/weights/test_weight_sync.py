"""Weight sync: no aliasing, batch boundaries only, acknowledged cascades, bad weights refused."""

from __future__ import annotations

import functools
import queue
import time
from typing import Any

import pytest
import torch

from rlcollect import keys
from rlcollect.collectors import (
    MultiAsyncCollector,
    MultiProcessWeightSyncScheme,
    MultiSyncCollector,
    NoWeightSyncScheme,
    SharedMemWeightSyncScheme,
)
from rlcollect.collectors.weights.schemes import check_schemes
from rlcollect.collectors.weights.sender import select_children
from rlcollect.errors import WorkerError
from tests.collectors.policies import BiasPolicy, bias_module

pytestmark = [
    pytest.mark.timeout(120),
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


def test_three_level_cascade_reaches_every_leaf_at_its_next_batch() -> None:
    policy = bias_module(0.5)
    inner = functools.partial(MultiSyncCollector, num_workers=2)
    with MultiSyncCollector(
        PENDULUM,
        policy,
        num_workers=2,
        frames_per_batch=40,
        collector_class=inner,
        track_policy_version=True,
    ) as collector:
        assert_acted_with(collector.next(), 0.5, 0)
        # An optimiser-like in-place change reaches no worker without an update.
        set_bias(policy, 1.5)
        assert_acted_with(collector.next(), 0.5, 0)
        collector.update_policy_weights_()
        batch = collector.next()
        assert batch.batch_size[:2] == (2, 2)
        assert_acted_with(batch, 1.5, 1)
        leaves = [
            leaf["policy_version"]
            for worker in collector.stats()["per_worker"]
            for leaf in worker["collector"]["per_worker"]
        ]
        assert leaves == [1, 1, 1, 1]
        assert collector.policy_version == 1


@pytest.mark.parametrize(
    "scheme", [SharedMemWeightSyncScheme, MultiProcessWeightSyncScheme], ids=lambda s: s.__name__
)
def test_schemes_deliver_weights_without_aliasing(scheme: type) -> None:
    policy = bias_module(0.5)
    with MultiSyncCollector(
        PENDULUM,
        policy,
        num_workers=2,
        frames_per_batch=20,
        weight_sync_schemes={"policy": scheme()},
        track_policy_version=True,
    ) as collector:
        set_bias(policy, -1.0)
        collector.update_policy_weights_()
        set_bias(policy, 2.0)  # after the update: must not leak into the workers' copy
        assert_acted_with(collector.next(), -1.0, 1)
        collector.update_policy_weights_(weights={"module.bias": torch.tensor([0.25])})
        assert_acted_with(collector.next(), 0.25, 2)


def test_no_weight_sync_scheme_keeps_the_first_weights() -> None:
    policy = bias_module(0.5)
    with MultiSyncCollector(
        PENDULUM,
        policy,
        num_workers=2,
        frames_per_batch=20,
        weight_sync_schemes={"policy": NoWeightSyncScheme()},
    ) as collector:
        set_bias(policy, 1.0)
        collector.update_policy_weights_()
        assert torch.all(collector.next()["action"] == 0.5)


def test_async_batches_each_come_from_one_policy_version() -> None:
    policy = bias_module(0.0)
    biases = {0: 0.0}
    with MultiAsyncCollector(
        PENDULUM,
        policy,
        num_workers=2,
        frames_per_batch=30,
        total_frames=600,
        track_policy_version=True,
    ) as collector:
        for index, batch in enumerate(collector):
            version = int(batch[VERSION].flatten()[0])
            assert_acted_with(batch, biases[version], version)
            if index % 3 == 0:
                biases[len(biases)] = float(len(biases)) / 10
                set_bias(policy, biases[len(biases) - 1])
                collector.update_policy_weights_()
    assert len(biases) > 3


def test_update_at_each_batch_sends_the_latest_weights_sync() -> None:
    policy = bias_module(0.5)
    with MultiSyncCollector(
        PENDULUM, policy, num_workers=2, frames_per_batch=20, update_at_each_batch=True
    ) as collector:
        collector.next()
        set_bias(policy, -0.5)
        batches = [collector.next() for _ in range(4)]
    assert torch.all(batches[-1]["action"] == -0.5)


def test_update_at_each_batch_sends_the_latest_weights_async() -> None:
    """A worker's batch already in flight may still use the old weights; from its next batch
    on, every worker acts with the latest ones, whichever worker is faster (on a busy machine
    one worker may hand over several batches before the other's first)."""
    policy = bias_module(0.5)
    with MultiAsyncCollector(
        PENDULUM,
        policy,
        num_workers=2,
        frames_per_batch=20,
        update_at_each_batch=True,
        track_worker_id=True,
    ) as collector:
        collector.next()
        set_bias(policy, -0.5)
        handed_over = {0: 0, 1: 0}
        later: list[torch.Tensor] = []
        while min(handed_over.values()) < 2:
            batch = collector.next()
            worker = int(batch[keys.WORKER_ID].flatten()[0])
            handed_over[worker] += 1
            if handed_over[worker] >= 2:
                later.append(batch["action"].clone())
    assert all(torch.all(actions == -0.5) for actions in later)


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        ({}, r"missing keys \['module.bias'\]"),
        ({"module.bias": torch.zeros(1), "extra": torch.zeros(1)}, r"unexpected keys \['extra'\]"),
        ({"module.bias": torch.zeros(2)}, r"weights\['module.bias'\] has shape \(2,\)"),
        ({"module.bias": torch.zeros(1, dtype=torch.float64)}, r"dtype torch.float64"),
    ],
)
def test_bad_weights_are_refused_before_anything_is_sent(weights: dict, match: str) -> None:
    with MultiSyncCollector(
        PENDULUM, bias_module(0.5), num_workers=2, frames_per_batch=20
    ) as collector:
        with pytest.raises(ValueError, match=match):
            collector.update_policy_weights_(weights)
        assert collector.policy_version == 0
        assert torch.all(collector.next()["action"] == 0.5)


def test_weights_that_require_grad_are_detached_not_a_hang() -> None:
    trained = BiasPolicy(1.25)
    assert trained.bias.requires_grad
    with MultiSyncCollector(
        PENDULUM, bias_module(0.5), num_workers=2, frames_per_batch=20
    ) as collector:
        started = time.monotonic()
        collector.update_policy_weights_(trained.state_dict(keep_vars=True))
        assert time.monotonic() - started < 5
        assert torch.all(collector.next()["action"] == 1.25)


def test_a_leaf_that_never_acknowledges_is_named_by_path() -> None:
    policy = bias_module(0.5)
    inner = functools.partial(MultiSyncCollector, num_workers=2)
    with MultiSyncCollector(
        PENDULUM, policy, num_workers=2, frames_per_batch=40, collector_class=inner
    ) as collector:
        set_bias(policy, BiasPolicy.HANG_BIAS)
        started = time.monotonic()
        with pytest.raises(WorkerError, match=r"worker \d -> worker \d failed: .*no answer within"):
            collector.update_policy_weights_(timeout=4.0)
        assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    "scheme", [SharedMemWeightSyncScheme, MultiProcessWeightSyncScheme], ids=lambda s: s.__name__
)
def test_sync_false_returns_once_sent_and_the_next_update_waits_for_it(scheme: type) -> None:
    """TorchRL's `sync=False`: an update returns without waiting for the workers (proven by
    weights whose loading never returns), every worker loads it before its next batch, and
    the next update first waits for the earlier one's acknowledgements."""
    policy = bias_module(0.5)
    with MultiSyncCollector(
        PENDULUM,
        policy,
        num_workers=2,
        frames_per_batch=20,
        weight_sync_schemes={"policy": scheme(sync=False)},
        track_policy_version=True,
    ) as collector:
        assert_acted_with(collector.next(), 0.5, 0)
        set_bias(policy, 1.5)
        collector.update_policy_weights_()
        assert_acted_with(collector.next(), 1.5, 1)
        set_bias(policy, BiasPolicy.HANG_BIAS)
        collector.update_policy_weights_(timeout=4.0)  # sent: the workers hang loading it
        assert collector.policy_version == 2
        set_bias(policy, 2.5)
        started = time.monotonic()
        with pytest.raises(WorkerError, match=r"worker \d failed: .*no answer within"):
            collector.update_policy_weights_(timeout=4.0)
        assert time.monotonic() - started < 10


def test_sync_false_in_async_collection_reaches_every_worker_after_its_batch_in_flight() -> None:
    """With `MultiAsyncCollector` a worker's batch in flight finishes on the old weights and
    every later batch of that worker comes from the new ones, each batch from one version."""
    policy = bias_module(0.5)
    with MultiAsyncCollector(
        PENDULUM,
        policy,
        num_workers=2,
        frames_per_batch=20,
        weight_sync_schemes={"policy": SharedMemWeightSyncScheme(sync=False)},
        track_policy_version=True,
        track_worker_id=True,
    ) as collector:
        assert_acted_with(collector.next(), 0.5, 0)
        set_bias(policy, 1.5)
        collector.update_policy_weights_()
        updated: set[int] = set()
        for _ in range(20):
            if updated == {0, 1}:
                break
            batch = collector.next()
            worker = int(batch[keys.WORKER_ID].flatten()[0])
            if worker in updated:  # once a worker has the new weights, it keeps them
                assert_acted_with(batch, 1.5, 1)
            elif torch.all(batch[VERSION] == 1):
                assert_acted_with(batch, 1.5, 1)
                updated.add(worker)
            else:
                assert_acted_with(batch, 0.5, 0)
        assert updated == {0, 1}


class QueueReceiver:
    """A `weight_recv_schemes` receiver: weights put on a queue, read before each batch."""

    def __init__(self) -> None:
        self.queue: queue.Queue = queue.Queue()

    def receive(self) -> Any:
        try:
            return self.queue.get_nowait()
        except queue.Empty:
            return None


def test_received_weights_are_forwarded_to_the_workers() -> None:
    receiver = QueueReceiver()
    with MultiSyncCollector(
        PENDULUM,
        bias_module(0.5),
        num_workers=2,
        frames_per_batch=20,
        weight_recv_schemes={"policy": receiver},
        track_policy_version=True,
    ) as collector:
        receiver.queue.put({"module.bias": torch.tensor([-1.5])})
        assert_acted_with(collector.next(), -1.5, 1)


def test_random_policies_have_no_weights_to_update() -> None:
    with MultiSyncCollector(PENDULUM, num_workers=2, frames_per_batch=20) as collector:
        with pytest.raises(RuntimeError, match=r"runs random actions"):
            collector.update_policy_weights_()
        with pytest.raises(ValueError, match=r"worker_ids has 5; workers are numbered 0..1"):
            select_children(collector.pool.slots, 5, "worker")


def test_other_model_ids_take_schemes_where_other_models_are_synced() -> None:
    # The multi-process collectors sync other models (an attribute path, as in TorchRL);
    # the Ray collector does not, and keeps refusing them.
    schemes = {"env.transform[0].module": SharedMemWeightSyncScheme()}
    assert check_schemes("weight_sync_schemes", schemes, other_models=True) == schemes
    with pytest.raises(ValueError, match=r"has the model id 'env.transform\[0\].module'"):
        check_schemes("weight_sync_schemes", schemes)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_workers_with_cuda_policies_take_updates_from_a_cuda_trainer() -> None:
    policy = bias_module(0.5).cuda()
    with MultiSyncCollector(
        PENDULUM,
        policy,
        num_workers=2,
        frames_per_batch=20,
        policy_device="cuda",
        storing_device="cpu",
        track_policy_version=True,
    ) as collector:
        assert_acted_with(collector.next(), 0.5, 0)
        set_bias(policy, 1.25)  # in place on the trainer's CUDA copy: no worker sees it
        assert_acted_with(collector.next(), 0.5, 0)
        collector.update_policy_weights_()
        batch = collector.next()
    assert batch["action"].device.type == "cpu"
    assert_acted_with(batch, 1.25, 1)

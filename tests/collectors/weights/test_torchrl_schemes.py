"""TorchRL's weight-sync scheme API on our collectors: `from_backend` builds the scheme TorchRL
builds, `init_on_sender` and `per_worker_weights` are taken, TorchRL's scheme instances are
mapped to ours (and deliver weights to real workers), and what we cannot serve is refused
naming the scheme to use."""

from __future__ import annotations

import pytest
import torch

from rlcollect import keys
from rlcollect.collectors import (
    MultiProcessWeightSyncScheme,
    MultiSyncCollector,
    NoWeightSyncScheme,
    SharedMemWeightSyncScheme,
)
from rlcollect.collectors.weights.schemes import WeightSyncScheme, check_schemes
from tests.collectors.policies import bias_module

torchrl_weights = pytest.importorskip("torchrl.weight_update")

pytestmark = pytest.mark.timeout(120)
BACKENDS = ["none", "direct", "shared", "thread", "process", "multiprocessing", "ray"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_from_backend_builds_the_scheme_torchrl_builds(backend: str) -> None:
    theirs = torchrl_weights.WeightSyncScheme.from_backend(backend)
    ours = WeightSyncScheme.from_backend(backend)
    assert isinstance(ours, WeightSyncScheme)
    assert type(ours).__name__ == type(theirs).__name__
    # TorchRL's instance, passed to a collector, becomes the same scheme of ours.
    mapped = check_schemes("weight_sync_schemes", {"policy": theirs})["policy"]
    assert type(mapped) is type(ours)


@pytest.mark.filterwarnings("ignore:state_dict strategy is experimental")
def test_torchrl_options_and_per_worker_weights_are_taken() -> None:
    ours = SharedMemWeightSyncScheme.from_backend(
        "shared", strategy="state_dict", sync=True, per_worker_weights=True
    )
    assert type(ours) is SharedMemWeightSyncScheme
    assert ours.per_worker_weights
    theirs = torchrl_weights.MultiProcessWeightSyncScheme(strategy="state_dict")
    mapped = check_schemes("weight_sync_schemes", {"policy": theirs})["policy"]
    assert type(mapped) is MultiProcessWeightSyncScheme
    assert not mapped.per_worker_weights
    theirs = torchrl_weights.SharedMemWeightSyncScheme(per_worker_weights=True)
    assert check_schemes("weight_sync_schemes", {"policy": theirs})["policy"].per_worker_weights
    none = check_schemes("w", {"policy": torchrl_weights.NoWeightSyncScheme()})["policy"]
    assert type(none) is NoWeightSyncScheme


@pytest.mark.parametrize("backend", ["shared", "thread", "process", "multiprocessing"])
def test_sync_false_is_taken_by_the_schemes_that_send_to_workers(backend: str) -> None:
    theirs = torchrl_weights.WeightSyncScheme.from_backend(backend, sync=False)
    ours = WeightSyncScheme.from_backend(backend, sync=False)
    assert type(ours).__name__ == type(theirs).__name__
    assert ours.sync is False
    assert theirs.sync is False
    assert WeightSyncScheme.from_backend(backend).sync is True
    # TorchRL's instance keeps its flag when it becomes ours.
    mapped = check_schemes("weight_sync_schemes", {"policy": theirs})["policy"]
    assert type(mapped) is type(ours)
    assert mapped.sync is False
    with pytest.raises(TypeError, match=r"sync must be True .* or False .*; got 'no'"):
        type(ours)(sync="no")


def test_init_on_sender_checks_the_model_id() -> None:
    scheme = MultiProcessWeightSyncScheme()
    assert not scheme.initialized_on_sender
    scheme.init_on_sender(model_id="policy", context=None)
    assert scheme.initialized_on_sender
    with pytest.raises(ValueError, match=r"model id 'value'.*'policy'"):
        scheme.init_on_sender(model_id="value", context=None)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: WeightSyncScheme.from_backend("rpc"), r"'rpc'.*SharedMemWeightSyncScheme"),
        (
            lambda: WeightSyncScheme.from_backend("distributed"),
            r"DistributedWeightSyncScheme.*RayWeightSyncScheme",
        ),
        (
            lambda: WeightSyncScheme.from_backend("pigeon"),
            r"Unsupported weight-sync backend 'pigeon'",
        ),
        (
            lambda: WeightSyncScheme.from_backend("ray", sync=False),
            r"sync=False is not supported by RayWeightSyncScheme.*take sync=False",
        ),
        (lambda: WeightSyncScheme.from_backend("none", sync=False), r"sync=False"),
        (lambda: WeightSyncScheme.from_backend("shared", strategy="bytes"), r"strategy='bytes'"),
        (
            lambda: MultiSyncCollector(
                "Pendulum-v1",
                bias_module(0.5),
                num_workers=2,
                frames_per_batch=20,
                weight_sync_schemes={"policy": torchrl_weights.RPCWeightSyncScheme()},
            ),
            r"weight_sync_schemes\['policy'\]: .*'rpc'.*MultiProcessWeightSyncScheme",
        ),
    ],
)
def test_what_we_cannot_serve_is_refused_naming_ours(call: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()  # type: ignore[operator]


@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
@pytest.mark.parametrize("name", ["SharedMemWeightSyncScheme", "MultiProcessWeightSyncScheme"])
def test_torchrl_scheme_instances_deliver_weights_to_our_workers(name: str) -> None:
    policy = bias_module(0.5)
    with MultiSyncCollector(
        "Pendulum-v1",
        policy,
        num_workers=2,
        frames_per_batch=20,
        weight_sync_schemes={"policy": getattr(torchrl_weights, name)()},
        track_policy_version=True,
    ) as collector:
        assert type(collector.scheme).__name__ == name
        assert torch.all(collector.next()["action"] == 0.5)
        collector.update_policy_weights_(weights={"module.bias": torch.tensor([0.25])})
        batch = collector.next()
    assert torch.all(batch["action"] == 0.25)
    assert torch.all(batch["next", keys.POLICY_VERSION] == 1)


@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
def test_per_worker_weights_reach_each_their_own_worker() -> None:
    """TorchRL's `per_worker_weights`: `update_policy_weights_({index: weights})` gives each
    worker its own weights, checked before any is sent, as one policy version."""
    with MultiSyncCollector(
        "Pendulum-v1",
        bias_module(0.5),
        num_workers=3,
        frames_per_batch=30,
        weight_sync_schemes={"policy": SharedMemWeightSyncScheme(per_worker_weights=True)},
        track_policy_version=True,
    ) as collector:
        collector.update_policy_weights_(
            {index: {"module.bias": torch.tensor([100.0 * (index + 1)])} for index in range(3)}
        )
        batch = collector.next()
        with pytest.raises(ValueError, match=r"shape"):
            collector.update_policy_weights_(
                {0: {"module.bias": torch.tensor([1.0])}, 1: {"module.bias": torch.ones(2)}}
            )
        with pytest.raises(ValueError, match=r"worker_ids=0; the keys already name"):
            collector.update_policy_weights_({0: {"module.bias": torch.ones(1)}}, worker_ids=0)
        assert torch.all(collector.next()["action"] == batch["action"])  # nothing was sent
    for index in range(3):
        assert torch.all(batch["action"][index] == 100.0 * (index + 1))
    assert torch.all(batch["next", keys.POLICY_VERSION] == 1)

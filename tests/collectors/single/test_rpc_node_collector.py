"""Our `Collector` as the node collector of TorchRL's `RPCCollector` (torch.distributed.rpc).

TorchRL's launcher hands every node collector its weight-sync schemes as receivers (at
construction, and again through `register_scheme_receiver`), then sends weights by calling
`_receive_weights_scheme` on the node as it sends them. A TorchRL scheme is set up on the
receiving side first (`init_on_receiver`, with the collector as context: its `policy` is the
policy module), then connected, and is driven by its sender from then on: never polled
before a batch (TorchRL's RPC scheme would block there, waiting for weights).
"""

from __future__ import annotations

import gc

import pytest
import torch

import rlcollect.collectors
from tests.collectors.multiprocess.launcher_checks import (
    RUN_TIMEOUT,
    assert_weights_reached_the_workers,
    launcher_run,
)
from tests.collectors.policies import greedy_module

torchrl_collectors = pytest.importorskip("torchrl.collectors")
weight_update = pytest.importorskip("torchrl.weight_update")


def library(name: str) -> object:
    return rlcollect.collectors if name == "rlcollect" else torchrl_collectors


@pytest.mark.parametrize("owner", ["rlcollect", "torchrl"])
@pytest.mark.parametrize("at", ["construction", "register_scheme_receiver"])
def test_a_torchrl_scheme_is_set_up_on_the_receiver_before_it_connects(owner: str, at: str) -> None:
    from torchrl.envs import GymEnv

    policy = greedy_module()
    scheme = weight_update.RPCWeightSyncScheme()
    given = {"weight_recv_schemes": {"policy": scheme}} if at == "construction" else {}
    collector = library(owner).Collector(
        GymEnv("CartPole-v1"), policy, frames_per_batch=10, total_frames=20, worker_idx=3, **given
    )
    try:
        if at == "register_scheme_receiver":
            collector.register_scheme_receiver({"policy": scheme})
        assert scheme.initialized_on_receiver
        assert scheme.synchronized_on_receiver
        assert scheme.worker_idx == 3
        assert scheme.model is collector.get_model("policy")
        gc.collect()  # TorchRL's schemes hold their context by weak reference
        assert scheme.context is not None, "the context must outlive set-up: it passes on"
        assert collector._receiver_schemes["policy"] is scheme
        # Driven by its sender, not polled: batches come without waiting for weights.
        assert [data.numel() for data in collector] == [10, 10]
    finally:
        collector.shutdown()


def test_a_scheme_set_up_as_a_sender_is_refused_as_a_receiver() -> None:
    from torchrl.envs import GymEnv

    sender = weight_update.SharedMemWeightSyncScheme()
    sender.init_on_sender(model_id="policy", model=greedy_module(), devices=[torch.device("cpu")])
    with (
        rlcollect.collectors.Collector(
            GymEnv("CartPole-v1"), greedy_module(), frames_per_batch=10
        ) as collector,
        pytest.raises(
            RuntimeError, match=r"weight_recv_schemes\['policy'\] is already set up as a sender"
        ),
    ):
        collector.register_scheme_receiver({"policy": sender})


@pytest.mark.timeout(RUN_TIMEOUT + 60)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
@pytest.mark.parametrize("owner", ["rlcollect", pytest.param("torchrl", marks=pytest.mark.slow)])
def test_rpc_collector_runs_our_collector_on_its_nodes(owner: str) -> None:
    """A real RPC group on this machine: the node collectors' first batch runs the first
    weights, every later one the weights sent after it, but those in flight at the update
    (TorchRL's `Collector` alike)."""
    result = launcher_run("rpc", owner, "Collector", False)
    assert_weights_reached_the_workers(result, "rpc", "Collector")

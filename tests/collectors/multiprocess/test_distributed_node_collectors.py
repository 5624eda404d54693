"""Our collectors as the node collectors of TorchRL's `DistributedCollector`.

TorchRL's launcher builds `collector_class` on every node and registers its weight-sync scheme
on the node collector's `policy`, the module received weights are written into before
`update_policy_weights_` passes them on to the workers. So a multi-process collector has a
`policy` in the parent with TorchRL's meaning (the policy given), built here from the factory
when only a factory was given (what TorchRL's node builds for its own multi-process
collectors), and `closed`, which the node reads when it shuts down.

The launcher runs for real: node processes on this machine in a gloo group on localhost
(tests/collectors/torchrl_launcher_runs.py). The `DistributedCollector` runs over our classes
share one launcher process (each run a process group of its own, its results checked by its own
test), which saves a process start per run; the `RPCCollector` runs (an RPC group starts once
per process) run in a process each. The same runs over TorchRL's own multi-process collectors
are not repeated here: they time out at shutdown on this machine (rank 0 waits 10 s for
`NODE_<i>_out`), as TorchRL's own `test_distributed_collector_class[Multi*]` does, so they
could hold ours to nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

import rlcollect.collectors
from tests.collectors.multiprocess.launcher_checks import (
    RUN_TIMEOUT,
    Case,
    assert_weights_reached_the_workers,
    case_result,
    launcher_run,
    launcher_runs,
)
from tests.collectors.multiprocess.recording_factory import RecordingFactory, pendulum

torchrl_collectors = pytest.importorskip("torchrl.collectors")
pytest.importorskip("torch.distributed")


def library(name: str) -> Any:
    return rlcollect.collectors if name == "rlcollect" else torchrl_collectors


# --- `policy` and `closed` on the parent, as TorchRL's ------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
@pytest.mark.parametrize("owner", ["rlcollect", "torchrl"])
@pytest.mark.parametrize("name", ["MultiSyncCollector", "MultiAsyncCollector"])
def test_policy_is_the_policy_given_and_closed_follows_shutdown(owner: str, name: str) -> None:
    from tests.collectors.multiprocess.recording_factory import policy_with_bias

    policy = policy_with_bias(0.5)
    collector = getattr(library(owner), name)(
        [pendulum], policy, frames_per_batch=20, total_frames=20
    )
    try:
        assert collector.policy is policy
        assert collector.closed is False
    finally:
        collector.shutdown()
    assert collector.closed is True


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
def test_factory_only_policy_is_built_here_once_at_first_read(tmp_path: Path) -> None:
    """TorchRL's multi-process collector has `policy` None then, and its node builds a
    policy from the factory itself; ours builds that copy here when `policy` is first read
    (and not before: the workers alone build theirs until then)."""
    factory = RecordingFactory(tmp_path / "calls")
    collector = rlcollect.collectors.MultiSyncCollector(
        [pendulum], policy_factory=factory, frames_per_batch=20, total_frames=40
    )
    try:
        collector.next()
        assert os.getpid() not in factory.pids()
        built = collector.policy
        assert isinstance(built, torch.nn.Module)
        assert collector.policy is built
        assert factory.pids().count(os.getpid()) == 1
        with pytest.raises(ValueError, match="built with policy_factory; pass weights"):
            collector.update_policy_weights_()
        # What a TorchRL scheme does on a node: write weights into it, pass them on.
        with torch.no_grad():
            built.module.bias.fill_(-0.75)
        collector.update_policy_weights_(built)
        assert torch.allclose(collector.next()["action"], torch.tensor(-0.75))
    finally:
        collector.shutdown()


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
def test_random_actions_have_no_policy() -> None:
    collector = rlcollect.collectors.MultiSyncCollector(
        [pendulum], frames_per_batch=20, total_frames=20
    )
    try:
        assert collector.policy is None
    finally:
        collector.shutdown()


# --- TorchRL's DistributedCollector over our node collectors ------------------------------------


DISTRIBUTED_CASES: list[Case] = [
    ("distributed", "rlcollect", name, pfactory)
    for name in ["Collector", "MultiSyncCollector", "MultiAsyncCollector"]
    for pfactory in [False, True]
]
RPC_CASES: list[Case] = [
    ("rpc", "rlcollect", name, pfactory)
    for name in ["MultiSyncCollector", "MultiAsyncCollector"]
    for pfactory in [False, True]
]


def case_id(case: Case) -> str:
    return f"{case[2]}-{'policy_factory' if case[3] else 'policy'}"


@pytest.fixture(scope="module")
def distributed_runs() -> dict[Case, dict[str, Any]]:
    return launcher_runs(DISTRIBUTED_CASES)


# The first of these tests runs every case (the module fixture above): its timeout bounds
# them all. The group keeps the cases on one pytest-xdist worker, so that the fixture runs
# once.
@pytest.mark.xdist_group("torchrl_distributed_launcher")
@pytest.mark.timeout(RUN_TIMEOUT * len(DISTRIBUTED_CASES) + 60)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
@pytest.mark.parametrize("case", DISTRIBUTED_CASES, ids=case_id)
def test_distributed_collector_runs_our_collectors_on_its_nodes(
    case: Case, distributed_runs: dict[Case, dict[str, Any]]
) -> None:
    """A single `Collector` node too: the scheme writes into `Collector.policy`, the module
    the steps run (TorchRL's meaning)."""
    result = case_result(distributed_runs, case)
    assert_weights_reached_the_workers(result, "distributed", case[2])


# TorchRL's RPC group does not start a second time in one process: a process per run.
@pytest.mark.timeout(RUN_TIMEOUT + 60)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
@pytest.mark.parametrize("case", RPC_CASES, ids=case_id)
def test_rpc_collector_updates_the_workers_of_our_multi_collectors(case: Case) -> None:
    """TorchRL's `RPCCollector` sends weights into the node collector's `policy` through its
    scheme, which passes them on with `update_policy_weights_` to the workers."""
    result = launcher_run(*case)
    assert_weights_reached_the_workers(result, "rpc", case[2])

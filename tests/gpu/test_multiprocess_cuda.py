"""CUDA policies in worker processes, and CPU workers beside a parent that uses CUDA.

How it works (`collectors/multiprocess/`, `collectors/weights/schemes.py`): workers start from
a fork server (`runtime/processes.py`: "forkserver" by default), a fresh interpreter that
preloads torch and rlcollect and never touches CUDA, so a worker starts with CUDA untouched
whatever its parent did. The policy travels to a worker with cloudpickle, by value (a CUDA
tensor is saved with its device and rebuilt there, not shared through CUDA IPC); updates
travel through a CPU copy (the shared-memory scheme's `.cpu().clone()`, the pipe scheme's
pickled `.cpu()` tensors) and each worker copies them into its own policy. So a worker's
weights never alias the trainer's: an in-place change of the trainer's parameters reaches no
worker until `update_policy_weights_`.

The env (`ProcessReportEnv`) reports at every step its process id, whether CUDA is initialized
there and how many calls of torch.cuda that process made; its reward is the action, so a batch
shows which weights acted. Every test has a CPU twin (`device="cpu"`) that runs anywhere.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from rlcollect import keys
from rlcollect.collectors import (
    MultiAsyncCollector,
    MultiProcessWeightSyncScheme,
    MultiSyncCollector,
    SharedMemWeightSyncScheme,
)
from tests.collectors.policies import bias_module
from tests.gpu.helpers import DEVICES
from tests.gpu.process_report import ProcessReportEnv

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]
VERSION = ("next", keys.POLICY_VERSION)
COLLECTORS = [MultiSyncCollector, MultiAsyncCollector]
SCHEMES = [SharedMemWeightSyncScheme, MultiProcessWeightSyncScheme]
# How many batches an async collector may take to bring every worker's next version.
MOST_BATCHES = 12


def set_bias(policy: torch.nn.Module, value: float) -> None:
    with torch.no_grad():
        policy.module.bias.fill_(value)


def acted_with(batch: Any) -> dict[int, set[tuple[int, float]]]:
    """worker pid -> the (policy version, action) pairs of its frames in `batch`."""
    pids = batch["pid"].flatten().tolist()
    versions = batch[VERSION].flatten().tolist()
    actions = batch["action"].flatten().tolist()
    pairs: dict[int, set[tuple[int, float]]] = {}
    for pid, version, action in zip(pids, versions, actions, strict=True):
        pairs.setdefault(pid, set()).add((version, action))
    return pairs


def batches_until_every_worker_runs(collector: Any, version: int, bias: float) -> set[int]:
    """Take batches until each worker produced one of `version`; every frame of every batch
    must act with its own version's weights (`bias` for `version`, 0.5 before). Returns the
    workers' pids."""
    done: set[int] = set()
    workers: set[int] = set()
    for _ in range(MOST_BATCHES):
        for pid, pairs in acted_with(collector.next()).items():
            workers.add(pid)
            for seen_version, action in pairs:
                assert action == (bias if seen_version == version else 0.5), pairs
                assert seen_version in (version - 1, version), pairs
            if (version, bias) in pairs:
                done.add(pid)
        if len(done) == 2:
            return workers
    raise AssertionError(f"workers {workers - done} never acted with version {version}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("collector_class", COLLECTORS)
def test_workers_take_updates_and_never_alias_the_trainers_weights(
    collector_class: type, scheme: type, device: str
) -> None:
    policy = bias_module(0.5).to(device)
    with collector_class(
        ProcessReportEnv,
        policy,
        num_workers=2,
        frames_per_batch=20,
        policy_device=device,
        storing_device="cpu",
        track_policy_version=True,
        weight_sync_schemes={"policy": scheme()},
    ) as collector:
        for _ in range(3):
            batch = collector.next()
            assert set(acted_with(batch)) - {os.getpid()}, "frames come from the workers"
            assert all(pairs == {(0, 0.5)} for pairs in acted_with(batch).values())
        # An optimiser-like in-place change of the trainer's weights reaches no worker...
        set_bias(policy, 1.25)
        for _ in range(3):
            assert all(pairs == {(0, 0.5)} for pairs in acted_with(collector.next()).values())
        # ... until the update, which every worker acknowledges before it returns.
        collector.update_policy_weights_()
        workers = batches_until_every_worker_runs(collector, 1, 1.25)
        # Nor does one after the update: the workers hold copies, not the trainer's tensors.
        set_bias(policy, 2.0)
        for _ in range(3):
            for pairs in acted_with(collector.next()).values():
                assert pairs == {(1, 1.25)}, pairs
    assert len(workers) == 2
    assert os.getpid() not in workers
    assert policy.module.bias.device.type == device
    assert float(policy.module.bias.detach()[0]) == 2.0, (
        "an update never writes the trainer's weights"
    )


def initialize_cuda_here(device: str) -> None:
    """On CUDA: initialize it in this process (the trainer's CUDA work); the CPU twin does
    nothing."""
    if device == "cuda":
        torch.zeros(1, device="cuda").sum()
        assert torch.cuda.is_initialized()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["forkserver", "spawn", "fork"])
def test_cpu_workers_never_touch_cuda_when_the_parent_did(method: str, device: str) -> None:
    """A CPU-only collector started after the parent initialised CUDA: its workers collect,
    take updates, and never call torch.cuda (counted in the worker from the env's creation
    on) nor initialise CUDA. With "fork" a worker is a forked copy of a parent that
    initialised CUDA, where a call that needs CUDA raises ("Cannot re-initialize CUDA in
    forked subprocess"). The CPU twin checks the same on any machine."""
    initialize_cuda_here(device)
    policy = bias_module(0.5)
    with MultiSyncCollector(
        ProcessReportEnv,
        policy,
        num_workers=2,
        frames_per_batch=20,
        mp_start_method=method,
        track_policy_version=True,
    ) as collector:
        first = collector.next()
        collector.update_policy_weights_(bias_module(1.25))
        second = collector.next()
    for batch, bias in ((first, 0.5), (second, 1.25)):
        assert torch.all(batch["action"] == bias)
        assert not batch["cuda_initialized"].any(), "a CPU worker initialised CUDA"
        assert not batch["cuda_calls"].any(), "a CPU worker called torch.cuda"
        pids = set(batch["pid"].flatten().tolist())
        assert len(pids) == 2
        assert os.getpid() not in pids

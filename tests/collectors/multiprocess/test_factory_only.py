"""A multi-process collector given only a `policy_factory` builds the policy in its workers
alone, as TorchRL's does: not once in this process, whether the workers fill a TorchRL replay
buffer or hand batches back, and updates are still checked here before they are sent."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

import rlcollect.collectors
from rlcollect.collectors.weights.schemes import SharedMemWeightSyncScheme
from tests.collectors.multiprocess.recording_factory import (
    RecordingFactory,
    pendulum,
    policy_with_bias,
)
from tests.conftest import processes_gone

torchrl_collectors = pytest.importorskip("torchrl.collectors")

# A shared TorchRL buffer keeps its locks' semaphores for the life of the process (see
# test_torchrl_buffers_multi.py): the workers are checked to be gone instead of the leak checks.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.mark.parametrize("library", ["rlcollect", "torchrl"])
def test_workers_alone_build_the_policy_and_lay_out_a_torchrl_buffer(
    library: str, tmp_path: Path
) -> None:
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    collectors = rlcollect.collectors if library == "rlcollect" else torchrl_collectors
    factory = RecordingFactory(tmp_path / "calls")
    buffer = ReplayBuffer(storage=LazyTensorStorage(400), shared=True)
    collector = collectors.MultiAsyncCollector(
        [pendulum, pendulum],
        policy_factory=factory,
        replay_buffer=buffer,
        frames_per_batch=16,
        total_frames=64,
    )
    try:
        for _ in collector:
            pass
    finally:
        collector.shutdown()
    pids = factory.pids()
    assert os.getpid() not in pids
    assert len(pids) == len(set(pids)) == 2  # once in each worker
    assert processes_gone(pids, 5)
    assert len(buffer) >= 64
    stored = buffer.storage[: len(buffer)]
    assert torch.allclose(stored["action"], torch.full_like(stored["action"], 0.25))


def test_updates_are_checked_against_worker_0s_policy_and_reach_every_worker(
    tmp_path: Path,
) -> None:
    factory = RecordingFactory(tmp_path / "calls")
    collector = rlcollect.collectors.MultiSyncCollector(
        [pendulum, pendulum],
        policy_factory=factory,
        frames_per_batch=20,
        total_frames=-1,
        restart_dead_workers=True,
    )
    try:
        # The shared copy is laid out at the first update, from weights worker 0 vouched for.
        assert isinstance(collector.scheme, SharedMemWeightSyncScheme)
        batch = collector.next()
        assert torch.equal(batch["action"], torch.full_like(batch["action"], 0.25))
        collector.update_policy_weights_(policy_with_bias(-0.5))
        batch = collector.next()
        assert torch.equal(batch["action"], torch.full_like(batch["action"], -0.5))
        # The plain module's state dict is taken too; what does not fit is refused here.
        collector.update_policy_weights_({"weight": torch.zeros(1, 3), "bias": torch.ones(1)})
        batch = collector.next()
        assert torch.equal(batch["action"], torch.ones_like(batch["action"]))
        with pytest.raises(ValueError, match=r"missing keys \['module.bias'\]"):
            collector.update_policy_weights_({"module.weight": torch.zeros(1, 3)})
        with pytest.raises(ValueError, match=r"shape \(2, 3\)"):
            collector.update_policy_weights_(
                {"module.weight": torch.zeros(2, 3), "module.bias": torch.ones(1)}
            )
        # A worker started after the shared copy was laid out gets it when it starts.
        os.kill(collector.pool.pids[1], signal.SIGKILL)
        batch = collector.next()
        assert torch.equal(batch["action"], torch.ones_like(batch["action"]))
        collector.update_policy_weights_(policy_with_bias(0.75))
        batch = collector.next()
        assert torch.equal(batch["action"], torch.full_like(batch["action"], 0.75))
    finally:
        collector.shutdown()
    pids = factory.pids()
    assert os.getpid() not in pids
    assert len(set(pids)) == 3  # the two workers and the one that replaced worker 1
    assert processes_gone(pids, 5)

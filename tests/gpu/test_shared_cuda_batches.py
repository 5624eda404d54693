"""Workers that store their batches on CUDA hand them over through CUDA IPC, which keeps no
stream order between two processes: the worker finishes its copies into the shared batch
before it answers, and the parent finishes copying the batch out before the worker may write
the next one (`finish_cuda_copies`, `collectors/devices.py`). On the CPU nothing is waited for
and no CUDA call is made.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from tensordict import LazyStackedTensorDict, NonTensorData, TensorDict

from rlcollect.collectors import MultiAsyncCollector, MultiSyncCollector
from rlcollect.collectors.devices import cuda_devices_of, finish_cuda_copies
from rlcollect.testing import CountingEnv
from tests.gpu.helpers import DEVICES, needs_cuda

ENVS, STEPS, BATCHES = 16, 50, 6
counting_envs = functools.partial(CountingEnv, episode_length=10_000, batch_size=(ENVS,))


def test_tensordicts_off_cuda_make_no_cuda_call(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("a CUDA call for a tensordict on the CPU")

    monkeypatch.setattr(torch.cuda, "current_stream", refuse)
    on_cpu = TensorDict({"a": torch.zeros(3)}, batch_size=[3], device="cpu")
    deviceless = TensorDict({"a": torch.zeros(3), "nested": {"b": torch.ones(3)}}, [3])
    deviceless.set("label", NonTensorData("text", batch_size=[3]))
    # Steps of different shapes (dynamic specs), lazily stacked: read part by part.
    ragged = LazyStackedTensorDict.lazy_stack(
        [TensorDict({"a": torch.zeros(2)}), TensorDict({"a": torch.zeros(3)})]
    )
    for tensordict in (on_cpu, deviceless, ragged, TensorDict()):
        assert cuda_devices_of(tensordict) == set()
        finish_cuda_copies(tensordict)


@pytest.mark.gpu
@needs_cuda
def test_the_wait_ends_after_the_work_queued_on_the_device() -> None:
    on_cuda = TensorDict({"a": torch.zeros(3, device="cuda")}, batch_size=[3])
    assert cuda_devices_of(on_cuda) == {torch.device("cuda", torch.cuda.current_device())}
    torch.cuda._sleep(200_000_000)  # a kernel that spins for a while
    assert not torch.cuda.current_stream().query(), "the kernel ended before the wait"
    finish_cuda_copies(on_cuda)
    assert torch.cuda.current_stream().query()


def worker_batches(batch: Any, collector_class: type) -> list[Any]:
    """One batch per worker: a synchronous collector's gathered batch stacks them."""
    return list(batch.unbind(0)) if collector_class is MultiSyncCollector else [batch]


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("collector_class", [MultiSyncCollector, MultiAsyncCollector])
def test_batches_stored_on_the_device_by_workers_arrive_whole(
    collector_class: type, device: str
) -> None:
    """Each worker's envs count steps and never end: its k-th batch must hold the steps
    `k * STEPS ...`; a stale batch (the one before) or a half-written one would not."""
    first_steps: dict[int, list[float]] = {0: [], 1: []}
    with collector_class(
        counting_envs,
        num_workers=2,
        # A gathered batch holds both workers' (sync); an async one, one worker's.
        frames_per_batch=ENVS * STEPS * (2 if collector_class is MultiSyncCollector else 1),
        storing_device=device,
    ) as collector:
        # At least BATCHES batches, and until each worker has handed in two: an asynchronous
        # collector yields whichever is ready, and a worker slow to start on a loaded machine
        # may hand in none of the first few (bounded, so a worker that never does fails).
        for gathered in range(BATCHES * 10):
            if gathered >= BATCHES and min(map(len, first_steps.values())) >= 2:
                break
            for batch in worker_batches(collector.next(), collector_class):
                assert batch["observation"].device.type == device
                observation = batch["observation"][..., 0].cpu()
                steps = observation[:, :1] + torch.arange(STEPS)
                assert torch.equal(observation, steps)
                assert torch.equal(batch["next", "observation"][..., 0].cpu(), steps + 1)
                assert (observation[:, 0] == observation[0, 0]).all()
                worker = int(batch["collector", "traj_ids"][0, 0]) % 2
                first_steps[worker].append(float(observation[0, 0]))
    for worker, firsts in first_steps.items():
        assert firsts == [STEPS * k for k in range(len(firsts))], worker
    assert min(len(firsts) for firsts in first_steps.values()) >= 2

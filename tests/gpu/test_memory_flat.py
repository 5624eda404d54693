"""A long run holds no more memory at batch 200 than at batch 10: the policy and the batches
on the device, each yielded batch dropped by the loop.

Two gauges: the tensors Python holds (any device: the CPU twin proves the check) and, on
CUDA, the bytes the caching allocator has handed out (`torch.cuda.memory_allocated()`), which
counts live tensors only, so it is exact from one batch to the next.
"""

from __future__ import annotations

import pytest
import torch

from rlcollect import Collector
from rlcollect.envs import GymEnv
from tests.gpu.helpers import DEVICES, live_tensors, pole_angle_module

pytestmark = pytest.mark.timeout(300)
FRAMES = 32
EARLY, LATE = 10, 200


def device_bytes(device: str) -> int:
    return torch.cuda.memory_allocated() if device == "cuda" else 0


@pytest.mark.parametrize("device", DEVICES)
def test_memory_after_batch_200_equals_memory_after_batch_10(device: str) -> None:
    env = GymEnv("CartPole-v1")
    env.set_seed(4)
    collector = Collector(
        env,
        pole_angle_module(),
        frames_per_batch=FRAMES,
        total_frames=FRAMES * (LATE + 1),
        policy_device=device,
        storing_device=device,
    )
    gauges = {}
    try:
        for index, batch in enumerate(collector):
            assert batch["action"].device.type == device
            del batch  # the loop keeps nothing of a batch
            if index in (EARLY, LATE):
                gauges[index] = (live_tensors(), device_bytes(device))
    finally:
        collector.shutdown()
    assert set(gauges) == {EARLY, LATE}
    assert gauges[LATE] == gauges[EARLY], gauges

"""The same device split in TorchRL's `Collector` and ours (CartPole on the CPU, the policy
and the batches on the device): the same keys, shapes, dtypes, devices and values.

TorchRL is optional here: each test imports it itself and skips without it.
"""

from __future__ import annotations

import pytest
from tensordict import TensorDictBase

from rlcollect import Collector
from rlcollect.envs import GymEnv
from tests.gpu.helpers import DEVICES, differing_entries, pole_angle_module

pytestmark = pytest.mark.timeout(120)
FRAMES, TOTAL = 50, 200
SEED = 7


def torchrl_batches(device: str) -> list[TensorDictBase]:
    torchrl_collectors = pytest.importorskip("torchrl.collectors")
    torchrl_envs = pytest.importorskip("torchrl.envs")
    collector_class = getattr(torchrl_collectors, "Collector", None)
    if collector_class is None:  # TorchRL before the rename
        collector_class = torchrl_collectors.SyncDataCollector
    env = torchrl_envs.GymEnv("CartPole-v1")
    env.set_seed(SEED)
    collector = collector_class(
        env,
        pole_angle_module(),
        frames_per_batch=FRAMES,
        total_frames=TOTAL,
        env_device="cpu",
        policy_device=device,
        storing_device=device,
    )
    try:
        return [batch.clone() for batch in collector]
    finally:
        collector.shutdown()


def our_batches(device: str) -> list[TensorDictBase]:
    env = GymEnv("CartPole-v1")
    env.set_seed(SEED)
    collector = Collector(
        env,
        pole_angle_module(),
        frames_per_batch=FRAMES,
        total_frames=TOTAL,
        env_device="cpu",
        policy_device=device,
        storing_device=device,
    )
    try:
        return list(collector)
    finally:
        collector.shutdown()


@pytest.mark.parametrize("device", DEVICES)
def test_the_same_batches_as_torchrl_on_the_same_device_split(device: str) -> None:
    theirs = torchrl_batches(device)
    ours = our_batches(device)
    assert len(ours) == len(theirs) == TOTAL // FRAMES
    for index, (mine, reference) in enumerate(zip(ours, theirs, strict=True)):
        assert mine.batch_size == reference.batch_size, index
        assert mine.device == reference.device, (index, mine.device, reference.device)
        my_keys = set(mine.keys(include_nested=True, leaves_only=True))
        their_keys = set(reference.keys(include_nested=True, leaves_only=True))
        assert my_keys == their_keys, (index, my_keys ^ their_keys)
        for key in their_keys:
            assert mine.get(key).device == reference.get(key).device, (index, key)
        assert not differing_entries(mine, reference), (index, differing_entries(mine, reference))

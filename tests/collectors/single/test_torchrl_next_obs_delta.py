"""A TorchRL transform that leaves `("next", <observation>)` out of the step's output: TorchRL's
`NextObservationDelta` keeps a float16 delta instead. Our batches are TorchRL's, side by side,
the policy still sees the full observation, and a TorchRL replay buffer with the same transform
rebuilds the next observations; in worker processes too."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import TensorDictBase

from rlcollect import Collector, MultiSyncCollector
from tests.collectors.policies import greedy_module
from tests.collectors.single.torchrl_parity import assert_same_batches, collect_all

torchrl_collectors = pytest.importorskip("torchrl.collectors")
torchrl_envs = pytest.importorskip("torchrl.envs")
torchrl_data = pytest.importorskip("torchrl.data")
transforms = pytest.importorskip("torchrl.envs.transforms")

FRAMES_PER_BATCH = 40
TOTAL_FRAMES = 80
DELTA = ("next", "delta", "observation")


def cartpole(delta: bool = True) -> Any:
    """TorchRL's CartPole cut to 10-step episodes (so that resets happen inside a batch),
    with NextObservationDelta last when `delta`."""
    parts = [torchrl_envs.StepCounter(10)]
    if delta:
        parts.append(transforms.NextObservationDelta())
    env = torchrl_envs.TransformedEnv(
        torchrl_envs.GymEnv("CartPole-v1"), torchrl_envs.Compose(*parts)
    )
    env.set_seed(3)
    return env


def run(collector_class: type, delta: bool = True) -> list[TensorDictBase]:
    return collect_all(
        collector_class,
        cartpole(delta),
        frames_per_batch=FRAMES_PER_BATCH,
        total_frames=TOTAL_FRAMES,
    )


@pytest.fixture(scope="module")
def batches() -> dict[str, list[TensorDictBase]]:
    return {
        "ours": run(Collector),
        "theirs": run(torchrl_collectors.Collector),
        "full": run(Collector, delta=False),
    }


def test_batches_are_torchrl_s(batches: dict[str, list[TensorDictBase]]) -> None:
    assert_same_batches(batches["ours"], batches["theirs"])
    for batch in batches["ours"]:
        present = set(batch.keys(include_nested=True, leaves_only=True))
        assert ("next", "observation") not in present
        assert batch[DELTA].dtype == torch.float16
        assert int(batch["next", "done"].sum()) >= 3  # resets inside the batch


def test_the_policy_sees_full_observations(batches: dict[str, list[TensorDictBase]]) -> None:
    """Root observations and actions are those of the same run without the transform."""
    for delta, full in zip(batches["ours"], batches["full"], strict=True):
        assert torch.equal(delta["observation"], full["observation"])
        assert torch.equal(delta["action"], full["action"])
        expected = (full["next", "observation"] - full["observation"]).half()
        assert torch.equal(delta[DELTA], expected)


def test_a_torchrl_buffer_rebuilds_next_observations(
    batches: dict[str, list[TensorDictBase]],
) -> None:
    frames = FRAMES_PER_BATCH * len(batches["ours"])
    buffer = torchrl_data.ReplayBuffer(
        storage=torchrl_data.LazyTensorStorage(frames),
        sampler=torchrl_data.SamplerWithoutReplacement(shuffle=False),
        transform=transforms.NextObservationDelta(in_keys=["observation"]),
        batch_size=frames,
    )
    for batch in batches["ours"]:
        buffer.extend(batch)
    rebuilt = buffer.sample()["next", "observation"]
    expected = torch.cat([batch["next", "observation"] for batch in batches["full"]])
    torch.testing.assert_close(rebuilt, expected, atol=1e-2, rtol=1e-2)


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children")
def test_workers_collect_it_too() -> None:
    """In worker processes: every step's delta is the next root observation minus this one,
    wherever the trajectory goes on."""
    collector = MultiSyncCollector(
        [cartpole] * 2, greedy_module(), frames_per_batch=FRAMES_PER_BATCH, total_frames=80
    )
    try:
        for batch in collector:
            assert ("next", "observation") not in batch.keys(include_nested=True)
            same_trajectory = ~batch["next", "done"][..., :-1, 0]
            steps = (batch["observation"][..., 1:, :] - batch["observation"][..., :-1, :]).half()
            assert torch.equal(steps[same_trajectory], batch[DELTA][..., :-1, :][same_trajectory])
            assert int(same_trajectory.sum()) > 0
    finally:
        collector.shutdown()

"""compact_obs=True with TorchRL's meaning: the `("next", <observation>)` entries left out, the
layout kept, side by side with TorchRL's Collector and through its `NextStateReconstructor`."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import TensorDictBase

from rlcollect import Collector
from rlcollect.testing import CountingEnv
from tests.collectors.single.torchrl_parity import assert_same_batches, collect_all

torchrl_collectors = pytest.importorskip("torchrl.collectors")
torchrl_envs = pytest.importorskip("torchrl.envs")
torchrl_data = pytest.importorskip("torchrl.data")
rb_transforms = pytest.importorskip("torchrl.envs.transforms.rb_transforms")

FRAMES_PER_BATCH = 40
TOTAL_FRAMES = 80


def torchrl_env() -> Any:
    """TorchRL's CartPole with the transforms whose keys compact_obs drops (StepCounter,
    InitTracker) and one it keeps per step (RewardSum's episode reward)."""
    env = torchrl_envs.TransformedEnv(
        torchrl_envs.GymEnv("CartPole-v1"),
        torchrl_envs.Compose(
            torchrl_envs.StepCounter(10),
            torchrl_envs.InitTracker(),
            torchrl_envs.RewardSum(),
        ),
    )
    env.set_seed(3)
    return env


def run(collector_class: type, **options: Any) -> list[TensorDictBase]:
    return collect_all(
        collector_class,
        torchrl_env(),
        frames_per_batch=FRAMES_PER_BATCH,
        total_frames=TOTAL_FRAMES,
        **options,
    )


@pytest.fixture(scope="module")
def batches() -> dict[str, list[TensorDictBase]]:
    return {
        "ours": run(Collector, compact_obs=True),
        "theirs": run(torchrl_collectors.Collector, compact_obs=True),
        "standard": run(Collector),
    }


def test_compact_batches_are_torchrl_s(batches: dict[str, list[TensorDictBase]]) -> None:
    assert_same_batches(batches["ours"], batches["theirs"])
    for batch in batches["ours"]:
        assert batch.batch_size == (FRAMES_PER_BATCH,)
        dropped = {("next", "observation"), ("next", "step_count"), ("next", "is_init")}
        assert not dropped & set(batch.keys(include_nested=True, leaves_only=True))
        assert ("next", "reward") in batch.keys(include_nested=True)


def test_compact_batches_keep_everything_else(batches: dict[str, list[TensorDictBase]]) -> None:
    for compact, standard in zip(batches["ours"], batches["standard"], strict=True):
        kept = set(compact.keys(include_nested=True, leaves_only=True))
        all_keys = set(standard.keys(include_nested=True, leaves_only=True))
        assert kept < all_keys
        for key in kept:
            assert torch.equal(compact[key], standard[key]), key


def test_next_state_reconstructor_rebuilds_next_observations(
    batches: dict[str, list[TensorDictBase]],
) -> None:
    """A TorchRL replay buffer with TorchRL's NextStateReconstructor takes our compact batches
    and gives back the standard batch's ("next", "observation") inside trajectories."""
    frames = FRAMES_PER_BATCH * len(batches["ours"])
    buffer = torchrl_data.ReplayBuffer(
        storage=torchrl_data.LazyTensorStorage(frames),
        sampler=torchrl_data.SamplerWithoutReplacement(shuffle=False),
        transform=rb_transforms.NextStateReconstructor(keys=["observation"]),
        batch_size=frames,
    )
    for batch in batches["ours"]:
        buffer.extend(batch)
    sample = buffer.sample()
    expected = torch.cat([batch["next", "observation"] for batch in batches["standard"]])
    rebuilt = sample["next", "observation"]
    # Lost (NaN): the step after which an episode ended, and the last one stored.
    lost = torch.cat([batch["next", "done"] for batch in batches["standard"]]).squeeze(-1)
    lost[-1] = True
    assert torch.equal(rebuilt.isnan().any(-1), lost)
    assert torch.equal(rebuilt[~lost], expected[~lost])


def test_compact_obs_and_store_obs_once_are_refused_together() -> None:
    with pytest.raises(ValueError, match="keep compact_obs=True for TorchRL's"):
        Collector(CountingEnv(), None, frames_per_batch=4, compact_obs=True, store_obs_once=True)


def test_compact_obs_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="compact_obs must be True or False; got 'yes'"):
        Collector(CountingEnv(), None, frames_per_batch=4, compact_obs="yes")

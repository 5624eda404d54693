"""Bad collector input raises at construction with the argument, the value and the fix."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from rlcollect import Collector
from rlcollect.envs import GymEnv
from rlcollect.replay import LazyTensorStorage, ReplayBuffer


@pytest.mark.parametrize("value", [0, -5])
def test_frames_per_batch_must_be_positive(value: int) -> None:
    with pytest.raises(ValueError, match=f"frames_per_batch={value} must be a positive"):
        Collector("CartPole-v1", None, frames_per_batch=value)


def test_frames_per_batch_must_be_int() -> None:
    with pytest.raises(TypeError, match="frames_per_batch must be an int"):
        Collector("CartPole-v1", None, frames_per_batch=10.5)


@pytest.mark.parametrize("value", [0, -2])
def test_total_frames_zero_or_negative(value: int) -> None:
    with pytest.raises(ValueError, match=f"total_frames={value} must be a positive"):
        Collector("CartPole-v1", None, frames_per_batch=10, total_frames=value)


def test_return_same_td_with_replay_buffer() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(100))
    with pytest.raises(ValueError, match="return_same_td=True cannot be used with replay_buffer"):
        Collector(
            "CartPole-v1", None, frames_per_batch=10, replay_buffer=buffer, return_same_td=True
        )


def test_replay_buffer_needs_extend() -> None:
    with pytest.raises(TypeError, match="replay_buffer must have an extend"):
        Collector("CartPole-v1", None, frames_per_batch=10, replay_buffer=object())


def test_policy_without_action_names_its_outputs() -> None:
    """Built as TorchRL builds it (a transform may be added for it); collecting fails."""
    policy = TensorDictModule(nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"])
    collector = Collector("CartPole-v1", policy, frames_per_batch=10)
    with pytest.raises(
        KeyError, match=r"must write the env's action key\(s\) \['action'\].*\['logits'\]"
    ):
        collector.next()


def test_unwrappable_policy_says_how_to_wrap() -> None:
    class TwoInputs(nn.Module):
        def forward(self, position: torch.Tensor, speed: torch.Tensor) -> torch.Tensor:
            return position

    with pytest.raises(TypeError, match=r"wrap it yourself: TensorDictModule"):
        Collector("CartPole-v1", TwoInputs(), frames_per_batch=10)
    with pytest.raises(TypeError, match="policy must be None, a TensorDict module"):
        Collector("CartPole-v1", 42, frames_per_batch=10)


def test_bad_env_arguments() -> None:
    with pytest.raises(TypeError, match="create_env_fn must be an env"):
        Collector(3, None, frames_per_batch=10)
    with pytest.raises(ValueError, match="create_env_fn='NoSuchEnv-v0' is not a registered"):
        Collector("NoSuchEnv-v0", None, frames_per_batch=10)
    with pytest.raises(TypeError, match="create_env_fn returned"):
        Collector(lambda: "not an env", None, frames_per_batch=10)


def test_weight_sync_schemes_on_a_leaf_collector_are_checked_and_updates_load_in_place() -> None:
    """TorchRL's examples pass `weight_sync_schemes` to `Collector` too: taken (ours or
    TorchRL's), checked, and an update loads the weights in place as without it."""
    from torchrl.weight_update import SharedMemWeightSyncScheme as TorchRLScheme

    from rlcollect.collectors import SharedMemWeightSyncScheme
    from tests.collectors.policies import bias_module

    with pytest.raises(TypeError, match=r"weight_sync_schemes\['policy'\] must be a WeightSync"):
        Collector("CartPole-v1", None, frames_per_batch=10, weight_sync_schemes={"policy": 1})
    for scheme in (SharedMemWeightSyncScheme(), TorchRLScheme()):
        policy = bias_module(0.5)
        with Collector(
            "Pendulum-v1",
            policy,
            frames_per_batch=10,
            weight_sync_schemes={"policy": scheme},
        ) as collector:
            assert torch.all(collector.next()["action"] == 0.5)
            collector.update_policy_weights_(weights={"module.bias": torch.tensor([0.25])})
            assert torch.all(collector.next()["action"] == 0.25)


def test_endless_collector_has_no_len() -> None:
    collector = Collector(GymEnv("CartPole-v1"), None, frames_per_batch=10)
    with pytest.raises(TypeError, match="endless collector"):
        len(collector)


def test_numpy_integers_are_frame_counts() -> None:
    collector = Collector(
        "CartPole-v1",
        None,
        frames_per_batch=np.int64(10),
        total_frames=np.int32(20),
        max_frames_per_traj=np.int64(5),
    )
    batches = list(collector)
    assert [batch.numel() for batch in batches] == [10, 10]
    assert batches[0]["next", "step_count"].max() <= 5


@pytest.mark.parametrize("argument", ["max_frames_per_traj", "init_random_frames"])
@pytest.mark.parametrize("value", ["5", 2.5])
def test_optional_frame_counts_must_be_int(argument: str, value: object) -> None:
    with pytest.raises(TypeError, match=f"{argument} must be an int, or None"):
        Collector("CartPole-v1", None, frames_per_batch=10, **{argument: value})


@pytest.mark.parametrize("value", [None, 0, -1])
def test_unset_optional_frame_counts(value: int | None) -> None:
    collector = Collector(
        "CartPole-v1",
        None,
        frames_per_batch=10,
        max_frames_per_traj=value,
        init_random_frames=value,
    )
    assert collector.init_random_frames == 0
    assert ("next", "step_count") not in collector.next().keys(include_nested=True)


def test_reset_when_done_false_is_refused() -> None:
    with pytest.raises(ValueError, match="reset_when_done=False is not supported"):
        Collector("CartPole-v1", None, frames_per_batch=10, reset_when_done=False)

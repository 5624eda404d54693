"""Tests for DoubleToFloat, checked against TorchRL's DoubleToFloat."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDictBase
from torchrl.envs import DoubleToFloat as TorchRLDoubleToFloat
from torchrl.envs import GymWrapper as TorchRLGymWrapper
from torchrl.envs import StepCounter as TorchRLStepCounter
from torchrl.envs import TransformedEnv as TorchRLTransformedEnv

from rlcollect.envs import GymEnv, SerialEnv, Unbounded
from rlcollect.keys import ACTION, NEXT, OBSERVATION, REWARD
from rlcollect.testing import TensorDictCountingEnv, check_env
from rlcollect.transforms import DoubleToFloat, StepCounter, TransformedEnv
from tests.transforms.transform_parity import (
    PENDULUM_ACTIONS,
    assert_faces_agree,
    assert_rows_match_single_envs,
    assert_same_entries,
    episode_ends,
    float64_pendulum,
    run_steps,
)

ENTRIES = [OBSERVATION, (NEXT, OBSERVATION), (NEXT, REWARD), ACTION, (NEXT, "done")]


def torchrl_env() -> TorchRLTransformedEnv:
    env = TorchRLTransformedEnv(TorchRLGymWrapper(float64_pendulum()), TorchRLDoubleToFloat())
    env.append_transform(TorchRLStepCounter(12))
    return env


def test_matches_torchrl_on_float64_pendulum() -> None:
    env = TransformedEnv(GymEnv(float64_pendulum()), DoubleToFloat())
    env.append_transform(StepCounter(12))
    reference = torchrl_env()
    assert env.action_spec.dtype == reference.action_spec.dtype == torch.float32
    assert env.observation_spec[OBSERVATION].dtype == torch.float32
    ours = run_steps(env, PENDULUM_ACTIONS)
    theirs = run_steps(reference, PENDULUM_ACTIONS)
    assert episode_ends(ours) == 2
    assert_same_entries(ours, theirs, ENTRIES)


def test_batched_rows_match_torchrl() -> None:
    env = TransformedEnv(SerialEnv(2, float64_pendulum), DoubleToFloat())
    env.append_transform(StepCounter(12))
    actions = [torch.stack([action, -action]) for action in PENDULUM_ACTIONS]
    ours = run_steps(env, actions)
    assert episode_ends(ours) == 4
    assert_rows_match_single_envs(ours, torchrl_env, actions, ENTRIES)


class RecordingEnv(TensorDictCountingEnv):
    """A counting env with a float64 action, recording the action dtypes it is stepped with."""

    def __init__(self) -> None:
        super().__init__(episode_length=3, batch_size=(2,))
        self.action_spec = Unbounded(shape=(2, 1), dtype=torch.float64)
        self.seen: list[torch.dtype] = []

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self.seen.append(tensordict.get(ACTION).dtype)
        return super()._step(tensordict)


def test_base_env_receives_float64_actions_and_the_caller_keeps_float32() -> None:
    base = RecordingEnv()
    env = TransformedEnv(base, DoubleToFloat())
    assert env.action_spec.dtype == torch.float32
    assert env.transform[0].in_keys_inv == [ACTION]
    root = env.rand_action(env.reset())
    assert root[ACTION].dtype == torch.float32
    step = env.step(root)
    assert base.seen == [torch.float64]
    assert step[ACTION].dtype == torch.float32


def test_explicit_in_keys_cast_only_those() -> None:
    env = TransformedEnv(GymEnv(float64_pendulum()), DoubleToFloat(in_keys=[OBSERVATION]))
    assert env.observation_spec[OBSERVATION].dtype == torch.float32
    assert env.action_spec.dtype == torch.float64  # no in_keys_inv: actions stay float64
    env.set_seed(0)
    assert env.rollout(3)[NEXT, OBSERVATION].dtype == torch.float32


def test_float32_env_is_left_unchanged() -> None:
    env = TransformedEnv(GymEnv("CartPole-v1"), DoubleToFloat())
    assert env.transform[0].in_keys == []
    assert env.transform[0].in_keys_inv == []
    assert env.observation_spec == env.base_env.observation_spec


def test_buffer_face_agrees_with_tensordict_face() -> None:
    env = TransformedEnv(GymEnv(float64_pendulum()), DoubleToFloat())
    assert_faces_agree(env, PENDULUM_ACTIONS[:10])
    batched = TransformedEnv(SerialEnv(2, float64_pendulum), DoubleToFloat())
    assert_faces_agree(batched, [torch.stack([action, -action]) for action in PENDULUM_ACTIONS])


def test_check_env_passes() -> None:
    check_env(TransformedEnv(GymEnv(float64_pendulum()), DoubleToFloat()), steps=10)
    check_env(TransformedEnv(SerialEnv(2, float64_pendulum), DoubleToFloat()), steps=10)
    check_env(TransformedEnv(RecordingEnv(), DoubleToFloat()), steps=10)


def test_rejects_keys_that_are_not_float64_or_unknown() -> None:
    with pytest.raises(TypeError, match="casts float64 entries only"):
        TransformedEnv(GymEnv("CartPole-v1"), DoubleToFloat(in_keys=[OBSERVATION]))
    with pytest.raises(ValueError, match="neither observations nor rewards"):
        TransformedEnv(GymEnv(float64_pendulum()), DoubleToFloat(in_keys=["pixels"]))

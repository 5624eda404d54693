"""Tests for RewardSum, checked against TorchRL's RewardSum."""

from __future__ import annotations

import pytest
import torch
from torchrl.envs import GymEnv as TorchRLGymEnv
from torchrl.envs import RewardSum as TorchRLRewardSum
from torchrl.envs import StepCounter as TorchRLStepCounter
from torchrl.envs import TransformedEnv as TorchRLTransformedEnv

from rlcollect.envs import GymEnv, SerialEnv
from rlcollect.keys import EPISODE_REWARD, NEXT, OBSERVATION, REWARD
from rlcollect.testing import check_env
from rlcollect.transforms import RewardSum, StepCounter, TransformedEnv
from tests.transforms.transform_parity import (
    BATCHED_CARTPOLE_ACTIONS,
    CARTPOLE_ACTIONS,
    COUNTING_ENVS,
    PENDULUM_ACTIONS,
    assert_faces_agree,
    assert_rows_match_single_envs,
    assert_same_entries,
    counting_actions,
    episode_ends,
    run_steps,
)

ENTRIES = [EPISODE_REWARD, (NEXT, EPISODE_REWARD), (NEXT, REWARD), (NEXT, OBSERVATION)]


def torchrl_env() -> TorchRLTransformedEnv:
    return TorchRLTransformedEnv(TorchRLGymEnv("CartPole-v1"), TorchRLRewardSum())


def test_matches_torchrl_on_cartpole() -> None:
    ours = run_steps(TransformedEnv(GymEnv("CartPole-v1"), RewardSum()), CARTPOLE_ACTIONS)
    theirs = run_steps(torchrl_env(), CARTPOLE_ACTIONS)
    assert episode_ends(ours) >= 3
    assert_same_entries(ours, theirs, ENTRIES)


def test_matches_torchrl_on_pendulum_with_truncation() -> None:
    ours_env = TransformedEnv(GymEnv("Pendulum-v1"), RewardSum())
    ours_env.append_transform(StepCounter(10))
    reference = TorchRLTransformedEnv(TorchRLGymEnv("Pendulum-v1"), TorchRLRewardSum())
    reference.append_transform(TorchRLStepCounter(10))
    ours = run_steps(ours_env, PENDULUM_ACTIONS[:25])
    theirs = run_steps(reference, PENDULUM_ACTIONS[:25])
    assert episode_ends(ours) == 2
    assert_same_entries(ours, theirs, ENTRIES)


def test_batched_rows_match_torchrl() -> None:
    ours = run_steps(
        TransformedEnv(SerialEnv(3, "CartPole-v1"), RewardSum()), BATCHED_CARTPOLE_ACTIONS
    )
    assert episode_ends(ours) >= 6
    assert_rows_match_single_envs(ours, torchrl_env, BATCHED_CARTPOLE_ACTIONS, ENTRIES)


def test_reset_root_is_zero_float32() -> None:
    env = TransformedEnv(GymEnv("CartPole-v1"), RewardSum())
    env.set_seed(0)
    root = env.reset()
    assert root[EPISODE_REWARD].tolist() == [0.0]
    assert root[EPISODE_REWARD].dtype == torch.float32


@pytest.mark.parametrize("make_env", COUNTING_ENVS.values(), ids=COUNTING_ENVS.keys())
def test_batched_partial_resets_sum_each_sub_env(make_env: object) -> None:
    data = run_steps(TransformedEnv(make_env(), RewardSum()), counting_actions(12))
    # one reward per step: the episode reward is the step count, the observation
    assert torch.equal(data[EPISODE_REWARD], data[OBSERVATION])
    assert torch.equal(data[NEXT, EPISODE_REWARD], data[NEXT, OBSERVATION])


def test_buffer_face_agrees_with_tensordict_face() -> None:
    assert_faces_agree(TransformedEnv(GymEnv("CartPole-v1"), RewardSum()), CARTPOLE_ACTIONS)
    for make_env in COUNTING_ENVS.values():
        assert_faces_agree(TransformedEnv(make_env(), RewardSum()), counting_actions(12))


def test_check_env_passes() -> None:
    check_env(TransformedEnv(GymEnv("CartPole-v1"), RewardSum()), steps=30)
    check_env(TransformedEnv(SerialEnv(2, "CartPole-v1"), RewardSum()), steps=30)


def test_spec_follows_reward_spec() -> None:
    env = TransformedEnv(COUNTING_ENVS["buffer-first"](), RewardSum())
    spec = env.observation_spec[EPISODE_REWARD]
    assert spec == env.reward_spec
    assert spec.shape == torch.Size([3, 1])
    assert spec.is_in(env.reset()[EPISODE_REWARD])


def test_custom_out_key() -> None:
    env = TransformedEnv(GymEnv("CartPole-v1"), RewardSum(out_keys=["return_so_far"]))
    env.set_seed(0)
    data = env.rollout(3)
    assert data[NEXT, "return_so_far"].squeeze(-1).tolist() == [1.0, 2.0, 3.0]


def test_rejects_unknown_reward_key() -> None:
    with pytest.raises(ValueError, match="is not a reward of the env"):
        TransformedEnv(GymEnv("CartPole-v1"), RewardSum(in_keys=["bonus"]))

"""Tests for InitTracker, checked against TorchRL's InitTracker."""

from __future__ import annotations

import pytest
import torch
from torchrl.envs import GymEnv as TorchRLGymEnv
from torchrl.envs import InitTracker as TorchRLInitTracker
from torchrl.envs import TransformedEnv as TorchRLTransformedEnv

from rlcollect.envs import GymEnv, SerialEnv
from rlcollect.keys import IS_INIT, NEXT, OBSERVATION, RESET
from rlcollect.testing import check_env
from rlcollect.transforms import InitTracker, TransformedEnv
from tests.transforms.transform_parity import (
    BATCHED_CARTPOLE_ACTIONS,
    CARTPOLE_ACTIONS,
    COUNTING_ENVS,
    assert_faces_agree,
    assert_rows_match_single_envs,
    assert_same_entries,
    counting_actions,
    episode_ends,
    run_steps,
)

ENTRIES = [IS_INIT, (NEXT, IS_INIT), OBSERVATION]


def torchrl_env() -> TorchRLTransformedEnv:
    return TorchRLTransformedEnv(TorchRLGymEnv("CartPole-v1"), TorchRLInitTracker())


def test_matches_torchrl_on_cartpole() -> None:
    ours = run_steps(TransformedEnv(GymEnv("CartPole-v1"), InitTracker()), CARTPOLE_ACTIONS)
    theirs = run_steps(torchrl_env(), CARTPOLE_ACTIONS)
    assert episode_ends(ours) >= 3
    assert_same_entries(ours, theirs, ENTRIES)
    assert int(ours[IS_INIT].sum()) == 1 + episode_ends(ours[:-1])


def test_batched_rows_match_torchrl() -> None:
    ours = run_steps(
        TransformedEnv(SerialEnv(3, "CartPole-v1"), InitTracker()), BATCHED_CARTPOLE_ACTIONS
    )
    assert episode_ends(ours) >= 6
    assert_rows_match_single_envs(ours, torchrl_env, BATCHED_CARTPOLE_ACTIONS, ENTRIES)


def test_true_at_reset_false_after_steps() -> None:
    env = TransformedEnv(GymEnv("CartPole-v1"), InitTracker())
    env.set_seed(0)
    root = env.reset()
    assert root[IS_INIT].tolist() == [True]
    assert root[IS_INIT].dtype == torch.bool
    assert env.step(env.rand_action(root))[NEXT, IS_INIT].tolist() == [False]


@pytest.mark.parametrize("make_env", COUNTING_ENVS.values(), ids=COUNTING_ENVS.keys())
def test_batched_partial_resets_flag_only_restarted_sub_envs(make_env: object) -> None:
    data = run_steps(TransformedEnv(make_env(), InitTracker()), counting_actions(12))
    assert torch.equal(data[IS_INIT], data[OBSERVATION] == 0)
    assert not data[NEXT, IS_INIT].any()


def test_partial_reset_without_previous_flags_follows_the_mask() -> None:
    env = TransformedEnv(COUNTING_ENVS["tensordict-first"](), InitTracker())
    request = env.reset().exclude(IS_INIT)
    mask = torch.tensor([[True], [False], [True]])
    root = env.reset(request.set(RESET, mask))
    assert torch.equal(root[IS_INIT], mask)


def test_buffer_face_agrees_with_tensordict_face() -> None:
    assert_faces_agree(TransformedEnv(GymEnv("CartPole-v1"), InitTracker()), CARTPOLE_ACTIONS)
    for make_env in COUNTING_ENVS.values():
        assert_faces_agree(TransformedEnv(make_env(), InitTracker()), counting_actions(12))


def test_check_env_passes() -> None:
    check_env(TransformedEnv(GymEnv("CartPole-v1"), InitTracker()), steps=30)
    check_env(TransformedEnv(SerialEnv(2, "CartPole-v1"), InitTracker()), steps=30)


def test_spec() -> None:
    env = TransformedEnv(COUNTING_ENVS["buffer-first"](), InitTracker())
    spec = env.observation_spec[IS_INIT]
    assert spec.shape == torch.Size([3, 1])
    assert spec.dtype == torch.bool
    assert spec.is_in(env.reset()[IS_INIT])

"""Tests for StepCounter, checked against TorchRL's StepCounter."""

from __future__ import annotations

import pytest
import torch
from torchrl.envs import GymEnv as TorchRLGymEnv
from torchrl.envs import StepCounter as TorchRLStepCounter
from torchrl.envs import TransformedEnv as TorchRLTransformedEnv

from rlcollect.envs import GymEnv, SerialEnv
from rlcollect.keys import NEXT, OBSERVATION, STEP_COUNT
from rlcollect.testing import check_env
from rlcollect.transforms import StepCounter, TransformedEnv
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

ENTRIES = [
    OBSERVATION,
    STEP_COUNT,
    "done",
    "truncated",
    "terminated",
    (NEXT, STEP_COUNT),
    (NEXT, "done"),
    (NEXT, "truncated"),
    (NEXT, "terminated"),
    (NEXT, OBSERVATION),
]


def torchrl_env(max_steps: int | None) -> TorchRLTransformedEnv:
    return TorchRLTransformedEnv(TorchRLGymEnv("CartPole-v1"), TorchRLStepCounter(max_steps))


@pytest.mark.parametrize("max_steps", [None, 5, 1])
def test_matches_torchrl_on_cartpole(max_steps: int | None) -> None:
    ours = run_steps(
        TransformedEnv(GymEnv("CartPole-v1"), StepCounter(max_steps)), CARTPOLE_ACTIONS
    )
    theirs = run_steps(torchrl_env(max_steps), CARTPOLE_ACTIONS)
    assert episode_ends(ours) >= 3
    assert_same_entries(ours, theirs, ENTRIES)


def test_batched_rows_match_torchrl() -> None:
    env = TransformedEnv(SerialEnv(3, "CartPole-v1"), StepCounter(max_steps=9))
    ours = run_steps(env, BATCHED_CARTPOLE_ACTIONS)
    assert episode_ends(ours) >= 9
    assert_rows_match_single_envs(ours, lambda: torchrl_env(9), BATCHED_CARTPOLE_ACTIONS, ENTRIES)


def test_reset_root_is_zero_and_first_step_is_one() -> None:
    env = TransformedEnv(GymEnv("CartPole-v1"), StepCounter())
    env.set_seed(0)
    root = env.reset()
    assert root[STEP_COUNT].tolist() == [0]
    assert root[STEP_COUNT].dtype == torch.int64
    step = env.step(env.rand_action(root))
    assert step[NEXT, STEP_COUNT].tolist() == [1]


def test_max_steps_truncates_and_keeps_done_consistent() -> None:
    env = TransformedEnv(GymEnv("Pendulum-v1"), StepCounter(max_steps=4))
    env.set_seed(0)
    data = env.rollout(10, break_when_any_done=False)
    assert data[NEXT, STEP_COUNT].squeeze(-1).tolist() == [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    truncated = data[NEXT, "truncated"].squeeze(-1)
    assert truncated.tolist() == [False, False, False, True] * 2 + [False, False]
    assert torch.equal(data[NEXT, "done"], data[NEXT, "terminated"] | data[NEXT, "truncated"])


@pytest.mark.parametrize("make_env", COUNTING_ENVS.values(), ids=COUNTING_ENVS.keys())
def test_batched_partial_resets_count_each_sub_env(make_env: object) -> None:
    data = run_steps(TransformedEnv(make_env(), StepCounter()), counting_actions(12))
    assert torch.equal(data[STEP_COUNT], data[OBSERVATION].long())
    assert torch.equal(data[NEXT, STEP_COUNT], data[NEXT, OBSERVATION].long())


@pytest.mark.parametrize("make_env", COUNTING_ENVS.values(), ids=COUNTING_ENVS.keys())
def test_batched_max_steps_truncates_only_long_sub_envs(make_env: object) -> None:
    data = run_steps(TransformedEnv(make_env(), StepCounter(max_steps=3)), counting_actions(9))
    assert data[NEXT, STEP_COUNT].max() == 3
    truncated = data[NEXT, "truncated"].squeeze(-1)
    assert not truncated[0].any()  # ends by itself after 2 steps
    assert truncated[2].tolist() == [False, False, True] * 3
    assert torch.equal(data[NEXT, "done"], data[NEXT, "terminated"] | data[NEXT, "truncated"])


def test_buffer_face_agrees_with_tensordict_face() -> None:
    assert_faces_agree(TransformedEnv(GymEnv("CartPole-v1"), StepCounter(5)), CARTPOLE_ACTIONS)
    for make_env in COUNTING_ENVS.values():
        assert_faces_agree(TransformedEnv(make_env(), StepCounter(4)), counting_actions(12))


@pytest.mark.parametrize("max_steps", [None, 4])
def test_check_env_passes(max_steps: int | None) -> None:
    check_env(TransformedEnv(GymEnv("CartPole-v1"), StepCounter(max_steps)), steps=30)
    check_env(TransformedEnv(SerialEnv(2, "CartPole-v1"), StepCounter(max_steps)), steps=30)


def test_spec() -> None:
    env = TransformedEnv(COUNTING_ENVS["buffer-first"](), StepCounter())
    spec = env.observation_spec[STEP_COUNT]
    assert spec.shape == torch.Size([3, 1])
    assert spec.dtype == torch.int64
    assert spec.is_in(env.reset()[STEP_COUNT])


@pytest.mark.parametrize("max_steps", [0, -3, True, 2.5, "5"])
def test_rejects_bad_max_steps(max_steps: int) -> None:
    with pytest.raises(ValueError, match="max_steps must be a positive integer"):
        StepCounter(max_steps)


def test_step_without_count_says_where_to_start() -> None:
    env = TransformedEnv(GymEnv("CartPole-v1"), StepCounter())
    env.set_seed(0)
    root = env.reset().exclude(STEP_COUNT)
    with pytest.raises(KeyError, match="step from the root that reset"):
        env.step(env.rand_action(root))

"""Tests for CatFrames, checked against TorchRL's CatFrames."""

from __future__ import annotations

import pytest
import torch
from torchrl.envs import CatFrames as TorchRLCatFrames
from torchrl.envs import GymEnv as TorchRLGymEnv
from torchrl.envs import TransformedEnv as TorchRLTransformedEnv

from rlcollect.envs import GymEnv, SerialEnv
from rlcollect.keys import NEXT, OBSERVATION
from rlcollect.testing import check_env
from rlcollect.transforms import CatFrames, TransformedEnv
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

CASES = [
    (3, "same", OBSERVATION),
    (4, "constant", OBSERVATION),
    (2, "same", "stacked"),
    (1, "same", "stacked"),
]


def torchrl_env(frames: int, **options: object) -> TorchRLTransformedEnv:
    transform = TorchRLCatFrames(frames, dim=-1, in_keys=[OBSERVATION], **options)
    return TorchRLTransformedEnv(TorchRLGymEnv("CartPole-v1"), transform)


@pytest.mark.parametrize(("frames", "padding", "out_key"), CASES)
def test_matches_torchrl_on_cartpole(frames: int, padding: str, out_key: str) -> None:
    options = {"padding": padding, "out_keys": [out_key]}
    ours = run_steps(
        TransformedEnv(GymEnv("CartPole-v1"), CatFrames(frames, **options)), CARTPOLE_ACTIONS
    )
    theirs = run_steps(torchrl_env(frames, **options), CARTPOLE_ACTIONS)
    assert episode_ends(ours) >= 3
    assert ours[out_key].shape == torch.Size([len(CARTPOLE_ACTIONS), 4 * frames])
    assert_same_entries(ours, theirs, [out_key, (NEXT, out_key), (NEXT, "reward")])


def test_batched_rows_match_torchrl() -> None:
    env = TransformedEnv(SerialEnv(3, "CartPole-v1"), CatFrames(3))
    ours = run_steps(env, BATCHED_CARTPOLE_ACTIONS)
    assert episode_ends(ours) >= 6
    entries = [OBSERVATION, (NEXT, OBSERVATION)]
    assert_rows_match_single_envs(ours, lambda: torchrl_env(3), BATCHED_CARTPOLE_ACTIONS, entries)


def test_spec_matches_torchrl() -> None:
    ours = TransformedEnv(GymEnv("CartPole-v1"), CatFrames(3)).observation_spec[OBSERVATION]
    theirs = torchrl_env(3).observation_spec[OBSERVATION]
    assert ours.shape == theirs.shape
    assert ours.dtype == theirs.dtype
    assert torch.equal(ours.low, theirs.space.low)
    assert torch.equal(ours.high, theirs.space.high)


def test_reset_pads_with_the_reset_observation() -> None:
    env = TransformedEnv(GymEnv("CartPole-v1"), CatFrames(3, out_keys=["stacked"]))
    env.set_seed(0)
    root = env.reset()
    assert torch.equal(root["stacked"], root[OBSERVATION].repeat(3))


@pytest.mark.parametrize("make_env", COUNTING_ENVS.values(), ids=COUNTING_ENVS.keys())
def test_batched_partial_resets_restart_only_their_windows(make_env: object) -> None:
    env = TransformedEnv(make_env(), CatFrames(3, out_keys=["stacked"]))
    data = run_steps(env, counting_actions(12))
    for root in (data, data[NEXT]):
        count = root[OBSERVATION]
        expected = torch.cat([(count - 2).clamp_min(0), (count - 1).clamp_min(0), count], -1)
        assert torch.equal(root["stacked"], expected)


def test_buffer_face_agrees_with_tensordict_face() -> None:
    assert_faces_agree(TransformedEnv(GymEnv("CartPole-v1"), CatFrames(3)), CARTPOLE_ACTIONS)
    for make_env in COUNTING_ENVS.values():
        assert_faces_agree(TransformedEnv(make_env(), CatFrames(4)), counting_actions(12))


def test_check_env_passes() -> None:
    check_env(TransformedEnv(GymEnv("CartPole-v1"), CatFrames(3)), steps=30)
    check_env(TransformedEnv(SerialEnv(2, "CartPole-v1"), CatFrames(2)), steps=30)


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="dim must be negative"):
        CatFrames(3, dim=0)
    with pytest.raises(ValueError, match="N must be a positive integer"):
        CatFrames(0)
    with pytest.raises(ValueError, match="padding must be"):
        CatFrames(2, padding="zeros")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="out of range"):
        TransformedEnv(GymEnv("CartPole-v1"), CatFrames(2, dim=-2))

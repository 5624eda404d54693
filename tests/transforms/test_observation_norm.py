"""Tests for ObservationNorm, checked against TorchRL's ObservationNorm."""

from __future__ import annotations

import pytest
import torch
from torchrl.envs import GymEnv as TorchRLGymEnv
from torchrl.envs import ObservationNorm as TorchRLObservationNorm
from torchrl.envs import TransformedEnv as TorchRLTransformedEnv

from rlcollect.envs import GymEnv, SerialEnv
from rlcollect.errors import MisuseError
from rlcollect.keys import NEXT, OBSERVATION
from rlcollect.testing import check_env
from rlcollect.transforms import CatFrames, Compose, ObservationNorm, TransformedEnv
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

LOC = torch.tensor([0.1, -0.2, 0.05, 0.3])
SCALE = torch.tensor([2.0, 0.5, 4.0, 1.5])
ENTRIES = [OBSERVATION, (NEXT, OBSERVATION), "normalized", (NEXT, "normalized")]


def torchrl_env(standard_normal: bool) -> TorchRLTransformedEnv:
    transform = TorchRLObservationNorm(
        LOC, SCALE, in_keys=[OBSERVATION], out_keys=["normalized"], standard_normal=standard_normal
    )
    return TorchRLTransformedEnv(TorchRLGymEnv("CartPole-v1"), transform)


def ours_norm(standard_normal: bool) -> ObservationNorm:
    return ObservationNorm(LOC, SCALE, out_keys=["normalized"], standard_normal=standard_normal)


@pytest.mark.parametrize("standard_normal", [False, True])
def test_fixed_stats_match_torchrl_on_cartpole(standard_normal: bool) -> None:
    ours = run_steps(
        TransformedEnv(GymEnv("CartPole-v1"), ours_norm(standard_normal)), CARTPOLE_ACTIONS
    )
    theirs = run_steps(torchrl_env(standard_normal), CARTPOLE_ACTIONS)
    assert episode_ends(ours) >= 3
    assert_same_entries(ours, theirs, ENTRIES)


def test_batched_rows_match_torchrl() -> None:
    env = TransformedEnv(SerialEnv(3, "CartPole-v1"), ours_norm(True))
    ours = run_steps(env, BATCHED_CARTPOLE_ACTIONS)
    assert episode_ends(ours) >= 6
    assert_rows_match_single_envs(
        ours, lambda: torchrl_env(True), BATCHED_CARTPOLE_ACTIONS, ENTRIES
    )


@pytest.mark.parametrize("standard_normal", [False, True])
def test_spec_bounds_match_torchrl(standard_normal: bool) -> None:
    norm = ObservationNorm(LOC[:3], SCALE[:3], standard_normal=standard_normal)
    reference = TorchRLTransformedEnv(
        TorchRLGymEnv("Pendulum-v1"),
        TorchRLObservationNorm(LOC[:3], SCALE[:3], [OBSERVATION], standard_normal=standard_normal),
    )
    ours = TransformedEnv(GymEnv("Pendulum-v1"), norm).observation_spec[OBSERVATION]
    theirs = reference.observation_spec[OBSERVATION]
    assert ours.shape == theirs.shape
    assert ours.dtype == theirs.dtype
    torch.testing.assert_close(ours.low, theirs.space.low)
    torch.testing.assert_close(ours.high, theirs.space.high)


@pytest.mark.parametrize("standard_normal", [False, True])
def test_init_stats_fits_the_rollouts_it_runs(standard_normal: bool) -> None:
    env = TransformedEnv(GymEnv("Pendulum-v1"), ObservationNorm(standard_normal=standard_normal))
    env.set_seed(0)
    torch.manual_seed(0)
    env.transform[0].init_stats(num_iter=300)
    env.set_seed(0)
    torch.manual_seed(0)
    data = torch.cat([env.base_env.rollout(300)[OBSERVATION] for _ in range(2)])
    mean, std = data.mean(0), data.std(0)
    norm = env.transform[0]
    if standard_normal:
        torch.testing.assert_close(norm.loc, mean)
        torch.testing.assert_close(norm.scale, std)
    else:
        torch.testing.assert_close(norm.scale, 1 / std)
        torch.testing.assert_close(norm.loc, -mean / std)
    assert env.observation_spec[OBSERVATION].is_in(env.reset()[OBSERVATION])


def test_init_stats_sees_the_transforms_before_it_only() -> None:
    stacked_first = Compose(CatFrames(2), ObservationNorm(standard_normal=True))
    env = TransformedEnv(GymEnv("CartPole-v1"), stacked_first)
    env.set_seed(0)
    stacked_first[1].init_stats(num_iter=50)
    assert stacked_first[1].loc.shape == torch.Size([8])
    norm_first = Compose(ObservationNorm(standard_normal=True), CatFrames(2))
    env = TransformedEnv(GymEnv("CartPole-v1"), norm_first)
    env.set_seed(0)
    norm_first[0].init_stats(num_iter=50)
    assert norm_first[0].loc.shape == torch.Size([4])
    assert env.reset()[OBSERVATION].shape == torch.Size([8])


def test_running_stats_normalize_with_everything_seen_so_far() -> None:
    env = TransformedEnv(GymEnv("CartPole-v1"), ObservationNorm(running=True, out_keys=["norm"]))
    data = run_steps(env, CARTPOLE_ACTIONS)
    raw = data[NEXT, OBSERVATION].double()
    for t in range(2, len(CARTPOLE_ACTIONS)):
        seen = raw[: t + 1]
        expected = (seen[-1] - seen.mean(0)) / seen.std(0)
        torch.testing.assert_close(data[NEXT, "norm"][t], expected.float())
    stats = env.transform[0].stats
    assert int(stats.count) == len(CARTPOLE_ACTIONS)
    torch.testing.assert_close(stats.mean_std()[1], raw.std(0))


@pytest.mark.parametrize("make_env", COUNTING_ENVS.values(), ids=COUNTING_ENVS.keys())
def test_running_stats_count_every_sub_env(make_env: object) -> None:
    env = TransformedEnv(make_env(), ObservationNorm(running=True, out_keys=["norm"]))
    data = run_steps(env, counting_actions(10))
    raw = data[NEXT, OBSERVATION].double().reshape(-1, 1)
    stats = env.transform[0].stats
    assert int(stats.count) == 30
    torch.testing.assert_close(stats.mean_std()[0], raw.mean(0))


def test_state_dict_round_trip_restores_running_stats() -> None:
    env = TransformedEnv(GymEnv("CartPole-v1"), ObservationNorm(running=True))
    run_steps(env, CARTPOLE_ACTIONS)
    saved = env.state_dict()
    assert set(saved) == {
        "transforms.0.stats.count",
        "transforms.0.stats.mean",
        "transforms.0.stats.m2",
    }
    restored = TransformedEnv(GymEnv("CartPole-v1"), ObservationNorm(running=True))
    restored.load_state_dict(saved)
    ours, theirs = run_steps(env, CARTPOLE_ACTIONS[:5]), run_steps(restored, CARTPOLE_ACTIONS[:5])
    assert torch.equal(ours[OBSERVATION], theirs[OBSERVATION])
    assert torch.equal(ours[NEXT, OBSERVATION], theirs[NEXT, OBSERVATION])
    # the saved copy does not follow the updates made since
    assert int(saved["transforms.0.stats.count"]) == len(CARTPOLE_ACTIONS)


def test_state_dict_round_trip_restores_estimated_stats() -> None:
    env = TransformedEnv(GymEnv("CartPole-v1"), ObservationNorm(standard_normal=True))
    env.set_seed(0)
    env.transform[0].init_stats(num_iter=50)
    restored = TransformedEnv(GymEnv("CartPole-v1"), ObservationNorm(standard_normal=True))
    restored.load_state_dict(env.state_dict())
    assert restored.transform[0].initialized
    assert torch.equal(restored.transform[0].loc, env.transform[0].loc)
    assert torch.equal(restored.transform[0].scale, env.transform[0].scale)


def test_buffer_face_agrees_with_tensordict_face() -> None:
    env = TransformedEnv(GymEnv("CartPole-v1"), ours_norm(True))
    assert_faces_agree(env, CARTPOLE_ACTIONS)
    batched = TransformedEnv(COUNTING_ENVS["buffer-first"](), ObservationNorm(loc=1.0, scale=2.0))
    assert_faces_agree(batched, counting_actions(12))


def test_check_env_passes_with_fixed_stats() -> None:
    check_env(TransformedEnv(GymEnv("CartPole-v1"), ours_norm(False)), steps=30)
    check_env(TransformedEnv(SerialEnv(2, "CartPole-v1"), ours_norm(True)), steps=30)


def test_rejects_bad_arguments_and_misuse() -> None:
    with pytest.raises(ValueError, match="needs both loc and scale"):
        ObservationNorm(loc=1.0)
    with pytest.raises(ValueError, match="computes loc and scale itself"):
        ObservationNorm(loc=1.0, scale=1.0, running=True)
    with pytest.raises(ValueError, match="do not broadcast"):
        TransformedEnv(GymEnv("Pendulum-v1"), ObservationNorm(LOC, SCALE))
    env = TransformedEnv(GymEnv("CartPole-v1"), ObservationNorm())
    with pytest.raises(MisuseError, match="call init_stats"):
        env.reset()
    with pytest.raises(MisuseError, match="not attached"):
        ObservationNorm().init_stats(10)
    with pytest.raises(MisuseError, match="already has them"):
        ours_norm(True).init_stats(10)
    with pytest.raises(MisuseError, match="uses running stats"):
        ObservationNorm(running=True).init_stats(10)


def test_loaded_stats_update_the_specs() -> None:
    loc, scale = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, 2.0, 2.0])
    source = TransformedEnv(GymEnv("Pendulum-v1"), ObservationNorm(loc=loc, scale=scale))
    target = TransformedEnv(GymEnv("Pendulum-v1"), ObservationNorm())
    target.load_state_dict(source.state_dict())
    expected, loaded = source.observation_spec[OBSERVATION], target.observation_spec[OBSERVATION]
    assert type(loaded) is type(expected)
    assert torch.equal(loaded.low, expected.low)
    assert torch.equal(loaded.high, expected.high)


def test_loaded_stats_of_the_wrong_shape_are_refused_and_change_nothing() -> None:
    env = TransformedEnv(GymEnv("Pendulum-v1"), ObservationNorm())
    before = env.observation_spec[OBSERVATION]
    bad = {"transforms.0.loc": torch.zeros(5), "transforms.0.scale": torch.ones(5)}
    with pytest.raises(ValueError, match=r"loc \(5,\) and scale \(5,\) do not broadcast"):
        env.load_state_dict(bad)
    assert env.transform[0].loc is None
    assert not env.transform[0].initialized
    assert env.observation_spec[OBSERVATION] == before

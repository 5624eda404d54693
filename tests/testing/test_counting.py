"""Tests for the counting envs of rlcollect.testing: exact values, both faces, both kinds."""

from __future__ import annotations

import pytest
import torch

from rlcollect.envs import allocate_carrier
from rlcollect.keys import ACTION, DONE, NEXT, OBSERVATION, REWARD, TERMINATED, TRUNCATED
from rlcollect.testing import CountingEnv, TensorDictCountingEnv, check_env

COUNTING_ENVS = [CountingEnv, TensorDictCountingEnv]


@pytest.mark.parametrize("env_class", COUNTING_ENVS)
def test_single_env_counts_and_terminates(env_class: type) -> None:
    env = env_class(episode_length=3)
    data = env.rollout(7, break_when_any_done=False)
    assert data[OBSERVATION].flatten().tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert data[NEXT, OBSERVATION].flatten().tolist() == [1, 2, 3, 1, 2, 3, 1]
    assert data[NEXT, REWARD].flatten().tolist() == [1.0] * 7
    ends = [False, False, True, False, False, True, False]
    assert data[NEXT, DONE].flatten().tolist() == ends
    assert data[NEXT, TERMINATED].flatten().tolist() == ends
    assert not data[NEXT, TRUNCATED].any()
    assert not data[DONE].any()


@pytest.mark.parametrize("env_class", COUNTING_ENVS)
def test_staggered_lengths_end_each_sub_env_on_its_own(env_class: type) -> None:
    env = env_class(episode_length=[1, 2, 3], batch_size=(3,))
    data = env.rollout(6, break_when_any_done=False)
    assert data.batch_size == torch.Size([3, 6])
    assert data[NEXT, OBSERVATION][..., 0].tolist() == [
        [1, 1, 1, 1, 1, 1],
        [1, 2, 1, 2, 1, 2],
        [1, 2, 3, 1, 2, 3],
    ]
    assert data[NEXT, DONE][..., 0].sum(-1).tolist() == [6, 3, 2]


@pytest.mark.parametrize("env_class", COUNTING_ENVS)
def test_specs_are_categorical_action_and_bounded_observation(env_class: type) -> None:
    env = env_class(episode_length=[2, 4], batch_size=(2,))
    assert env.action_spec.shape == torch.Size([2])
    assert env.action_spec.dtype == torch.int64
    assert env.observation_spec[OBSERVATION].shape == torch.Size([2, 1])
    assert env.observation_spec[OBSERVATION].high.flatten().tolist() == [2.0, 4.0]
    assert env.reward_spec.shape == torch.Size([2, 1])
    assert env.done_spec[DONE].dtype == torch.bool
    assert env.set_seed(10) == 12


@pytest.mark.parametrize("env_class", COUNTING_ENVS)
def test_buffer_face_matches_across_env_kinds(env_class: type) -> None:
    carriers = []
    for kind in (CountingEnv, env_class):
        env = kind(episode_length=[[2, 3], [4, 1]], batch_size=(2, 2))
        carrier = allocate_carrier(env.full_spec, steps=9)
        env.bind(carrier)
        env.reset_into(0)
        for t in range(9):
            env.step_and_advance_into(t)
        carriers.append(carrier)
    reference, other = carriers
    assert reference[NEXT, DONE].sum() == 9 // 2 + 9 // 3 + 9 // 4 + 9
    for key in reference.keys(include_nested=True, leaves_only=True):
        assert torch.equal(reference[key], other[key]), key
    assert reference[OBSERVATION][0, 0, :, 0].tolist() == [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]


def test_partial_reset_into_touches_only_selected_sub_envs() -> None:
    env = CountingEnv(episode_length=10, batch_size=(3,))
    carrier = allocate_carrier(env.full_spec, steps=3)
    env.bind(carrier)
    env.reset_into(0)
    env.step_and_advance_into(0)
    env.step_and_advance_into(1)
    env.reset_into(2, torch.tensor([False, True, False]))
    assert carrier[OBSERVATION][:, 2, 0].tolist() == [2.0, 0.0, 2.0]
    env.step_and_advance_into(2)
    assert carrier[NEXT, OBSERVATION][:, 2, 0].tolist() == [3.0, 1.0, 3.0]


def test_action_is_ignored() -> None:
    env = CountingEnv(episode_length=4)
    root = env.reset()
    root[ACTION] = torch.tensor(1)
    assert env.step(root)[NEXT, OBSERVATION].item() == 1.0


@pytest.mark.parametrize(
    ("episode_length", "batch_size", "match"),
    [
        (0, (), "episode_length must be >= 1"),
        ([3, -1], (2,), "episode_length must be >= 1"),
        ([3, 4, 5], (2,), r"does not broadcast to the batch size \(2,\)"),
    ],
)
@pytest.mark.parametrize("env_class", COUNTING_ENVS)
def test_bad_episode_length_is_refused(
    env_class: type, episode_length: object, batch_size: tuple, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        env_class(episode_length=episode_length, batch_size=batch_size)


class TensorPathCountingEnv(CountingEnv):
    """CountingEnv forced onto its torch code path (the one non-CPU devices take)."""

    def _as_array(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor


def test_torch_path_matches_numpy_path() -> None:
    carriers = []
    for kind in (CountingEnv, TensorPathCountingEnv):
        env = kind(episode_length=[2, 3, 5], batch_size=(3,))
        check_env(env, steps=12)
        carrier = allocate_carrier(env.full_spec, steps=11)
        env.bind(carrier)
        env.reset_into(0)
        for t in range(11):
            env.step_and_advance_into(t)
        env.reset_into(11, torch.tensor([True, False, True]))
        carriers.append(carrier)
    reference, other = carriers
    for key in reference.keys(include_nested=True, leaves_only=True):
        assert torch.equal(reference[key], other[key]), key


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("env_class", COUNTING_ENVS)
def test_counting_env_on_cuda(env_class: type) -> None:
    env = env_class(episode_length=[2, 3], batch_size=(2,), device="cuda")
    check_env(env, steps=8)
    data = env.rollout(4, break_when_any_done=False)
    assert data[NEXT, OBSERVATION].device.type == "cuda"
    assert data[NEXT, OBSERVATION][..., 0].tolist() == [[1, 2, 1, 2], [1, 2, 3, 1]]


def test_carrier_on_another_device_is_refused() -> None:
    env = CountingEnv()
    carrier = allocate_carrier(env.full_spec, steps=2, device="meta")
    with pytest.raises(ValueError, match="CountingEnv on cpu got a carrier on meta"):
        env.bind(carrier)

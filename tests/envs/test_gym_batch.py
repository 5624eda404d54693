"""Tests of `GymBatch`, the batched face `SerialEnv` uses over plain `GymEnv`s: the carrier it
fills equals what each sub-env's own buffer face writes, resets and action encodings included."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.envs import GymEnv, SerialEnv, allocate_carrier
from rlcollect.envs.base import EnvBase
from rlcollect.envs.gym_batch import MIN_ENVS, GymBatch

STEPS = 40
SEED = 3

CASES: dict[str, Callable[[], GymEnv]] = {
    "one-hot": lambda: GymEnv("CartPole-v1"),
    "categorical": lambda: GymEnv("CartPole-v1", categorical_action_encoding=True),
    # Short episodes so that truncations and resets happen within the run.
    "box": lambda: GymEnv("Pendulum-v1", max_episode_steps=7),
}


def run_buffer_face(env: EnvBase, seed: int, actions: torch.Tensor) -> TensorDictBase:
    """Seed, reset and step `env` with `actions` (`[*batch, STEPS + 1, ...]`) through its
    buffer face; returns the filled carrier."""
    carrier = allocate_carrier(env.full_spec, steps=STEPS)
    carrier.set(keys.ACTION, actions)
    env.set_seed(seed)
    env.bind(carrier)
    env.reset_into(0)
    for t in range(STEPS):
        env.step_and_advance_into(t)
    return carrier


@pytest.mark.parametrize("case", list(CASES))
def test_batched_step_writes_what_each_sub_env_writes(case: str) -> None:
    make = CASES[case]
    batched = SerialEnv(MIN_ENVS, make)
    assert GymBatch.of(batched.envs) is not None, "the batched face must be the one under test"
    torch.manual_seed(0)
    actions = torch.stack([batched.action_spec.rand() for _ in range(STEPS + 1)], 1)
    data = run_buffer_face(batched, SEED, actions)
    batched.close()
    assert data[keys.NEXT, keys.DONE].any(), "the run must cross an episode end"
    for index in range(MIN_ENVS):
        single = make()
        expected = run_buffer_face(single, SEED + index, actions[index])
        single.close()
        for key in expected.keys(include_nested=True, leaves_only=True):
            assert torch.equal(data[index].get(key), expected.get(key)), (index, key)


def test_batched_step_resets_only_the_envs_that_ended() -> None:
    env = SerialEnv(MIN_ENVS, lambda: GymEnv("Pendulum-v1", max_episode_steps=5))
    actions = torch.zeros(MIN_ENVS, STEPS + 1, 1)
    data = run_buffer_face(env, SEED, actions)
    env.close()
    done = data[keys.NEXT, keys.DONE][..., :STEPS, 0]
    assert done[:, 4::5].all()
    assert done.sum() == MIN_ENVS * (STEPS // 5)
    carried = data[keys.OBSERVATION][:, 1 : STEPS + 1][~done]
    assert torch.equal(carried, data[keys.NEXT, keys.OBSERVATION][:, :STEPS][~done])
    reset = data[keys.OBSERVATION][:, 1 : STEPS + 1][done]
    assert not torch.equal(reset, data[keys.NEXT, keys.OBSERVATION][:, :STEPS][done])


class DictObservation(gym.ObservationWrapper):
    """CartPole with its observation under a dict entry (a sub-env the batch cannot write)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Dict({"state": env.observation_space})

    def observation(self, observation: object) -> dict:
        return {"state": observation}


def test_few_sub_envs_or_ones_that_need_their_own_face_are_not_batched() -> None:
    dict_env = SerialEnv(MIN_ENVS, lambda: GymEnv(DictObservation(gym.make("CartPole-v1"))))
    plain = SerialEnv(MIN_ENVS, lambda: GymEnv(gym.make("CartPole-v1")))
    assert GymBatch.of(dict_env.envs) is None
    assert GymBatch.of([*plain.envs, dict_env.envs[0]]) is None
    assert GymBatch.of(plain.envs) is not None
    assert GymBatch.of(plain.envs[: MIN_ENVS - 1]) is None, "too few to be worth batching"
    carrier = allocate_carrier(dict_env.full_spec, steps=3)
    dict_env.set_seed(0)
    dict_env.bind(carrier)
    dict_env.reset_into(0)
    dict_env.step_and_advance_into(0)
    assert carrier["state"][:, 1].abs().sum() > 0
    dict_env.close()
    plain.close()

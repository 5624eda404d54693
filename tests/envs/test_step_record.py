"""`GymVectorEnv(record_steps=True)`: every step's Gymnasium infos and observations kept per
carrier slot (reset infos at the root, step infos under next, carried to slot 0 with the
observation), the step times, what the env was doing when it raised; and `seed_next_reset`."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlcollect import keys
from rlcollect.envs.gym_vector import GymVectorEnv
from rlcollect.envs.step_record import RESET, STEP, infos_per_env

EPISODE_LEN = 3


class InfoEnv(gym.Env):
    """Observation and info count the episode's steps; episodes last `EPISODE_LEN` steps."""

    observation_space = gym.spaces.Box(-1.0, 100.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, fail_at_step: int | None = None) -> None:
        self._t = 0
        self._steps = 0
        self._fail_at_step = fail_at_step

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self._t = 0
        return np.array([0.0], np.float32), {"t": 0, "reset": True}

    def step(self, action: int) -> tuple:
        self._steps += 1
        if self._steps == self._fail_at_step:
            raise RuntimeError("the env failed")
        self._t += 1
        observation = np.array([self._t], np.float32)
        return observation, 1.0, self._t >= EPISODE_LEN, False, {"t": self._t}


def vector_env(num_envs: int = 2, **kwargs: object) -> GymVectorEnv:
    envs = gym.vector.SyncVectorEnv([lambda: InfoEnv(**kwargs) for _ in range(num_envs)])
    return GymVectorEnv(envs, categorical_action_encoding=True, record_steps=True)


def carrier_for(env: GymVectorEnv, steps: int) -> object:
    frame = env.fake_tensordict()
    carrier = frame.unsqueeze(1).expand(env.num_envs, steps + 1).clone()
    env.bind(carrier)
    return carrier


def test_infos_per_env_reads_gymnasiums_vector_infos() -> None:
    info = {"t": np.array([1, 2]), "_t": np.array([True, False]), "x": np.array([5, 6])}
    assert infos_per_env(info, 2) == [{"t": 1, "x": 5}, {"x": 6}]
    assert infos_per_env([{"a": 1}, {}], 2) == [{"a": 1}, {}]


def test_each_slot_keeps_its_infos_observations_and_step_time() -> None:
    env = vector_env()
    record = env.step_record
    record.keep_observations = True
    steps = 4
    carrier = carrier_for(env, steps)
    env.reset_into(0)
    assert record.root_infos_at(0) == [{"t": 0, "reset": True}] * 2
    for t in range(steps):
        carrier[keys.ACTION][:, t] = 0
        env.step_and_advance_into(t)
    # Episode of 3 steps: step 2 ends it, the reset writes root 3.
    assert [info["t"] for info in record.next_infos[0]] == [1, 1]
    assert record.next_infos[2] == [{"t": 3}] * 2
    assert record.root_infos[3] == [{"t": 0, "reset": True}] * 2
    assert record.root_infos[2] == [{"t": 2}] * 2
    assert np.asarray(record.next_observations[2]).ravel().tolist() == [3.0, 3.0]
    assert np.asarray(record.root_observations[3]).ravel().tolist() == [0.0, 0.0]
    assert (np.diff(record.stepped_at[:steps]) >= 0).all()
    assert record.last_step == steps - 1
    seconds, count = record.take_step_time()
    assert count == steps
    assert seconds > 0
    assert record.take_step_time() == (0.0, 0)


def test_slot_zero_takes_the_last_slots_infos_when_the_batch_carries_over() -> None:
    env = vector_env(num_envs=1)
    record = env.step_record
    steps = 2
    carrier = carrier_for(env, steps)
    env.reset_into(steps)  # as a collector starts: the reset lands in slot T
    assert record.root_infos_at(0) == [{"t": 0, "reset": True}]
    for batch in range(2):
        for t in range(steps):
            carrier[keys.ACTION][:, t] = 0
            env.step_and_advance_into(t)
        # The loop copies slot T to slot 0; the record does the same for its infos.
        last = record.root_infos[steps]
        assert record.root_infos_at(0) == last, batch


def test_a_masked_reset_writes_only_the_selected_sub_envs_infos() -> None:
    env = vector_env(num_envs=2)
    record = env.step_record
    carrier_for(env, 1)
    env.reset_into(0)
    record.root_infos[0] = [{"old": 0}, {"old": 1}]
    env.reset_into(0, torch.tensor([False, True]))
    assert record.root_infos[0] == [{"old": 0}, {"t": 0, "reset": True}]


def test_the_phase_says_what_the_env_was_doing_when_it_raised() -> None:
    env = vector_env(num_envs=1, fail_at_step=2)
    record = env.step_record
    carrier = carrier_for(env, 3)
    env.reset_into(0)
    carrier[keys.ACTION][:] = 0
    env.step_and_advance_into(0)
    assert record.phase is None
    with pytest.raises(RuntimeError, match="the env failed"):
        env.step_and_advance_into(1)
    assert (record.phase, record.last_step) == (STEP, 0)
    record.begin(RESET, masked=True)
    assert (record.phase, record.masked) == (RESET, True)


def test_seed_next_reset_seeds_the_next_full_reset_itself() -> None:
    def first_observations(seeded: bool) -> np.ndarray:
        env = GymVectorEnv("CartPole-v1", num_envs=3)
        carrier = carrier_for(env, 1)
        if seeded:
            env.seed_next_reset(7)
        env.reset_into(0)
        observation = carrier[keys.OBSERVATION][:, 0].clone().numpy()
        env.close()
        return observation

    plain = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")
    expected, _ = plain.reset(seed=7)
    plain.close()
    np.testing.assert_array_equal(first_observations(True), expected)
    assert not np.array_equal(first_observations(False), expected)


def test_without_record_steps_nothing_is_kept() -> None:
    env = GymVectorEnv("CartPole-v1", num_envs=2)
    assert env.step_record is None
    env.close()

"""Tests of `GymVectorEnv`: same-step autoreset, partial resets, seeding and argument errors."""

from __future__ import annotations

from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.envs import GymEnv, GymVectorEnv, SerialEnv, allocate_carrier
from rlcollect.envs.base import EnvBase
from rlcollect.testing import check_env

STEPS = 60  # long enough for random CartPole episodes (~20 steps) to end and reset


def random_actions(env: EnvBase, steps: int, seed: int) -> torch.Tensor:
    """One-hot CartPole actions of shape `[*batch, steps + 1, 2]`, the same for a given seed."""
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(0, 2, (*env.batch_size, steps + 1), generator=generator)
    return torch.nn.functional.one_hot(index, 2)


def run_buffer_face(
    env: EnvBase, seed: int, actions: torch.Tensor, fused: bool = True
) -> TensorDictBase:
    """Seed, reset and step `env` through its buffer face; returns the filled carrier."""
    carrier = allocate_carrier(env.full_spec, steps=actions.shape[len(env.batch_size)] - 1)
    carrier.set(keys.ACTION, actions)
    env.set_seed(seed)
    env.bind(carrier)
    env.reset_into(0)
    for t in range(carrier.batch_size[-1] - 1):
        if fused:
            env.step_and_advance_into(t)
        else:
            env.step_into(t)
            env.advance_into(t)
    return carrier


def cartpole_vector(num_envs: int, mode: AutoresetMode) -> gym.vector.SyncVectorEnv:
    return gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1")] * num_envs, autoreset_mode=mode
    )


@pytest.fixture
def vector4() -> Iterator[GymVectorEnv]:
    env = GymVectorEnv("CartPole-v1", num_envs=4)
    yield env
    env.close()


def test_batch_size_specs_and_rollout_layout(vector4: GymVectorEnv) -> None:
    assert vector4.batch_size == torch.Size([4])
    assert vector4.observation_spec[keys.OBSERVATION].shape == torch.Size([4, 4])
    assert vector4.action_spec.shape == torch.Size([4, 2])
    assert vector4.done_spec[keys.TRUNCATED].shape == torch.Size([4, 1])
    assert vector4.set_seed(3) == 7
    data = vector4.rollout(5, break_when_any_done=False)
    assert data.batch_size == torch.Size([4, 5])
    assert data.names == [None, keys.TIME_DIM_NAME]


@pytest.mark.parametrize("fused", [True, False])
def test_matches_serial_env_step_for_step(vector4: GymVectorEnv, fused: bool) -> None:
    actions = random_actions(vector4, STEPS, seed=0)
    ours = run_buffer_face(vector4, 5, actions, fused)
    serial = SerialEnv(4, "CartPole-v1")
    expected = run_buffer_face(serial, 5, actions)
    serial.close()
    assert ours[keys.NEXT, keys.DONE].sum() >= 4, "the run must cross several episode ends"
    assert (ours == expected).all()


def test_sub_env_i_matches_a_gym_env_seeded_with_seed_plus_i(vector4: GymVectorEnv) -> None:
    actions = random_actions(vector4, STEPS, seed=1)
    batched = run_buffer_face(vector4, 20, actions)
    single = GymEnv("CartPole-v1")
    for index in range(4):
        expected = run_buffer_face(single, 20 + index, actions[index])
        assert (batched[index] == expected).all(), f"sub-env {index} differs"
    single.close()


def test_done_step_keeps_the_terminal_observation_in_next(vector4: GymVectorEnv) -> None:
    carrier = run_buffer_face(vector4, 0, random_actions(vector4, STEPS, seed=2))
    done = carrier[keys.NEXT, keys.TERMINATED][:, :-1, 0]
    env_index, t = (int(i) for i in done.nonzero()[0])
    terminal = carrier[keys.NEXT, keys.OBSERVATION][env_index, t]
    restarted = carrier[keys.OBSERVATION][env_index, t + 1]
    # CartPole terminates when the cart or the pole leaves its range; resets land near 0
    assert terminal[0].abs() > 2.4 or terminal[2].abs() > 0.2095
    assert restarted.abs().max() < 0.05
    assert not carrier[keys.DONE][env_index, t + 1].any()


def test_reset_into_with_a_mask_resets_only_the_selected_sub_envs(vector4: GymVectorEnv) -> None:
    carrier = allocate_carrier(vector4.full_spec, steps=2)
    vector4.bind(carrier)
    vector4.reset_into(0)
    carrier.get(keys.OBSERVATION)[:, 1].fill_(9.0)
    vector4.reset_into(1, torch.tensor([False, True, True, False]))
    observations = carrier.get(keys.OBSERVATION)[:, 1]
    assert (observations[[0, 3]] == 9.0).all()
    assert observations[[1, 2]].abs().max() < 0.05
    vector4.reset_into(1, torch.zeros(4, dtype=torch.bool))
    assert (observations[[0, 3]] == 9.0).all()


def test_reset_with_reset_key_keeps_the_other_sub_envs(vector4: GymVectorEnv) -> None:
    vector4.set_seed(0)
    root = vector4.reset()
    root.set(keys.OBSERVATION, torch.full((4, 4), 5.0))
    root.set(keys.RESET, torch.tensor([[True], [False], [False], [True]]))
    result = vector4.reset(root)
    assert (result[keys.OBSERVATION][[1, 2]] == 5.0).all()
    assert result[keys.OBSERVATION][[0, 3]].abs().max() < 0.05


def test_check_env_passes_same_step_and_disabled_modes() -> None:
    for env in (
        GymVectorEnv("CartPole-v1", num_envs=4),
        GymVectorEnv(cartpole_vector(3, AutoresetMode.DISABLED)),
        GymVectorEnv("FrozenLake-v1", num_envs=3),  # Discrete observations: one-hot
    ):
        check_env(env, steps=STEPS)
        env.close()


def test_disabled_mode_matches_same_step_mode() -> None:
    same_step = GymVectorEnv(cartpole_vector(3, AutoresetMode.SAME_STEP))
    disabled = GymVectorEnv(cartpole_vector(3, AutoresetMode.DISABLED))
    actions = random_actions(same_step, STEPS, seed=3)
    assert (run_buffer_face(same_step, 1, actions) == run_buffer_face(disabled, 1, actions)).all()
    same_step.close()
    disabled.close()


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leftover_children")
def test_async_vector_env_matches_sync() -> None:
    asynchronous = GymVectorEnv("CartPole-v1", num_envs=2, vectorization_mode="async")
    synchronous = GymVectorEnv("CartPole-v1", num_envs=2)
    actions = random_actions(synchronous, 30, seed=4)
    try:
        ours = run_buffer_face(asynchronous, 2, actions)
        assert (ours == run_buffer_face(synchronous, 2, actions)).all()
    finally:
        asynchronous.close()
        synchronous.close()


def test_argument_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match=r"vector_env_or_id='NoSuchEnv-v0' is not a registered"):
        GymVectorEnv("NoSuchEnv-v0", num_envs=2)
    with pytest.raises(ValueError, match="num_envs must be a positive int"):
        GymVectorEnv("CartPole-v1")
    with pytest.raises(ValueError, match=r"num_envs must be a positive int.*num_envs=2\.5"):
        GymVectorEnv("CartPole-v1", num_envs=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Wrap a single gymnasium\.Env with GymEnv"):
        GymVectorEnv(gym.make("CartPole-v1"))  # type: ignore[arg-type]
    vector_env = cartpole_vector(2, AutoresetMode.SAME_STEP)
    with pytest.raises(ValueError, match="num_envs=3 but the vector env has 2"):
        GymVectorEnv(vector_env, num_envs=3)
    with pytest.raises(ValueError, match=r"autoreset_mode='Later' is not an AutoresetMode"):
        GymVectorEnv("CartPole-v1", num_envs=2, autoreset_mode="Later")
    vector_env.close()


def test_categorical_action_encoding_and_continuous_actions() -> None:
    env = GymVectorEnv("CartPole-v1", num_envs=2, categorical_action_encoding=True)
    assert env.action_spec.shape == torch.Size([2])
    check_env(env, steps=30)
    env.close()
    pendulum = GymVectorEnv("Pendulum-v1", num_envs=2)
    carrier = allocate_carrier(pendulum.full_spec, steps=3)
    carrier.set(keys.ACTION, torch.full((2, 4, 1), 2.0))
    pendulum.set_seed(0)
    pendulum.bind(carrier)
    pendulum.reset_into(0)
    pendulum.step_and_advance_into(0)
    assert np.all(carrier[keys.NEXT, keys.REWARD][:, 0].numpy() <= 0.0)
    pendulum.close()


class ShiftedDiscrete(gym.Env):
    """Discrete spaces with a `start`: the observation is 10 + the last action (-1, 0 or 1)."""

    observation_space = gym.spaces.Discrete(3, start=9)
    action_space = gym.spaces.Discrete(3, start=-1)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.steps = 0
        return 10, {}

    def step(self, action: int) -> tuple:
        assert action in (-1, 0, 1), action
        self.steps += 1
        return 10 + int(action), float(action), self.steps == 4, False, {}


def test_discrete_spaces_with_a_start_match_serial_env() -> None:
    vector = GymVectorEnv(
        gym.vector.SyncVectorEnv([ShiftedDiscrete] * 3, autoreset_mode="SameStep")
    )
    serial = SerialEnv(3, ShiftedDiscrete)
    index = torch.randint(0, 3, (3, 11), generator=torch.Generator().manual_seed(0))
    actions = torch.nn.functional.one_hot(index, 3)
    ours, expected = run_buffer_face(vector, 0, actions), run_buffer_face(serial, 0, actions)
    assert (ours == expected).all()
    rewards = ours[keys.NEXT, keys.REWARD][:, :-1, 0]
    assert torch.equal(rewards, (index[:, :-1] - 1).float())
    check_env(vector, steps=12)
    vector.close()
    serial.close()


def test_advance_into_resets_a_sub_env_that_a_wrapper_marked_done(vector4: GymVectorEnv) -> None:
    carrier = allocate_carrier(vector4.full_spec, steps=2)
    carrier.set(keys.ACTION, random_actions(vector4, 2, seed=5))
    vector4.set_seed(30)
    vector4.bind(carrier)
    vector4.reset_into(0)
    vector4.step_into(0)
    carrier[keys.NEXT, keys.TRUNCATED][1, 0] = True  # as a step limit would
    carrier[keys.NEXT, keys.DONE][1, 0] = True
    vector4.advance_into(0)
    next_observation, root = carrier[keys.NEXT, keys.OBSERVATION][:, 0], carrier[keys.OBSERVATION]
    assert torch.equal(root[[0, 2, 3], 1], next_observation[[0, 2, 3]])
    single = GymEnv("CartPole-v1")
    expected = allocate_carrier(single.full_spec, steps=2)
    expected.set(keys.ACTION, carrier.get(keys.ACTION)[1])
    single.set_seed(31)
    single.bind(expected)
    single.reset_into(0)
    single.step_into(0)
    single.reset_into(1)
    assert torch.equal(root[1, 1], expected[keys.OBSERVATION][1])
    assert not torch.equal(root[1, 1], next_observation[1])
    single.close()

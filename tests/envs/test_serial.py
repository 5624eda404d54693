"""Tests of `SerialEnv`: batching, the buffer face, partial resets, seeding and argument errors."""

from __future__ import annotations

from collections.abc import Iterator

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.envs import GymEnv, SerialEnv, allocate_carrier
from rlcollect.envs.base import EnvBase
from rlcollect.errors import MisuseError
from rlcollect.testing import CountingEnv, check_env
from rlcollect.transforms import CatFrames, Compose, RewardSum, StepCounter, TransformedEnv

STEPS = 60  # long enough for random CartPole episodes (~20 steps) to end and reset


def random_actions(env: EnvBase, steps: int, seed: int) -> torch.Tensor:
    """One-hot CartPole actions of shape `[*batch, steps + 1, 2]`, the same for a given seed."""
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(0, 2, (*env.batch_size, steps + 1), generator=generator)
    return torch.nn.functional.one_hot(index, 2)


def run_buffer_face(env: EnvBase, seed: int, actions: torch.Tensor) -> TensorDictBase:
    """Seed, reset and step `env` through its buffer face; returns the filled carrier."""
    carrier = allocate_carrier(env.full_spec, steps=actions.shape[len(env.batch_size)] - 1)
    carrier.set(keys.ACTION, actions.to(carrier.get(keys.ACTION).dtype))
    env.set_seed(seed)
    env.bind(carrier)
    env.reset_into(0)
    for t in range(carrier.batch_size[-1] - 1):
        env.step_and_advance_into(t)
    return carrier


@pytest.fixture
def cartpoles() -> Iterator[SerialEnv]:
    env = SerialEnv(3, "CartPole-v1")
    yield env
    env.close()


def test_batch_size_specs_and_rollout_layout(cartpoles: SerialEnv) -> None:
    assert cartpoles.batch_size == torch.Size([3])
    assert cartpoles.observation_spec[keys.OBSERVATION].shape == torch.Size([3, 4])
    assert cartpoles.action_spec.shape == torch.Size([3, 2])
    assert cartpoles.reward_spec.shape == torch.Size([3, 1])
    assert cartpoles.done_spec[keys.DONE].shape == torch.Size([3, 1])
    cartpoles.set_seed(0)
    data = cartpoles.rollout(5, break_when_any_done=False)
    assert data.batch_size == torch.Size([3, 5])
    assert data.names == [None, keys.TIME_DIM_NAME]
    assert data[keys.NEXT, keys.OBSERVATION].shape == torch.Size([3, 5, 4])
    assert data[keys.NEXT, keys.REWARD].dtype == torch.float32


def test_set_seed_returns_next_free_seed_and_reproduces_runs(cartpoles: SerialEnv) -> None:
    assert cartpoles.set_seed(7) == 10
    actions = random_actions(cartpoles, STEPS, seed=1)
    first = run_buffer_face(cartpoles, 7, actions)
    second = run_buffer_face(cartpoles, 7, actions)
    assert (first == second).all()
    other = run_buffer_face(cartpoles, 8, actions)
    assert not torch.equal(first[keys.OBSERVATION], other[keys.OBSERVATION])


def test_sub_env_i_matches_a_gym_env_seeded_with_seed_plus_i(cartpoles: SerialEnv) -> None:
    actions = random_actions(cartpoles, STEPS, seed=2)
    batched = run_buffer_face(cartpoles, 10, actions)
    assert batched[keys.NEXT, keys.DONE].any(), "the run must cross an episode end"
    for index in range(3):
        single = GymEnv("CartPole-v1")
        expected = run_buffer_face(single, 10 + index, actions[index])
        single.close()
        assert (batched[index] == expected).all(), f"sub-env {index} differs"


def test_bind_gives_each_sub_env_a_view_of_the_carrier(cartpoles: SerialEnv) -> None:
    carrier = allocate_carrier(cartpoles.full_spec, steps=4)
    cartpoles.set_seed(0)
    cartpoles.bind(carrier)
    cartpoles.reset_into(0)
    cartpoles.step_and_advance_into(0)
    observations = carrier.get(keys.OBSERVATION)
    assert observations[:, :2].abs().sum(-1).gt(0).all(), "every sub-env wrote its own rows"
    assert not observations[:, 2:].any(), "nothing is written beyond t + 1"


def test_reset_into_with_a_mask_resets_only_the_selected_sub_envs(cartpoles: SerialEnv) -> None:
    carrier = allocate_carrier(cartpoles.full_spec, steps=2)
    cartpoles.bind(carrier)
    carrier.get(keys.OBSERVATION).fill_(9.0)
    carrier.get(keys.DONE).fill_(True)
    cartpoles.reset_into(1, torch.tensor([True, False, True]))
    observations, done = carrier.get(keys.OBSERVATION)[:, 1], carrier.get(keys.DONE)[:, 1, 0]
    assert observations[[0, 2]].abs().max() < 0.05, "CartPole resets near 0"
    assert (observations[1] == 9.0).all()
    assert done.tolist() == [False, True, False]


def test_reset_with_reset_key_keeps_the_other_sub_envs(cartpoles: SerialEnv) -> None:
    cartpoles.set_seed(0)
    root = cartpoles.reset()
    root.set(keys.OBSERVATION, torch.full((3, 4), 5.0))
    root.set(keys.RESET, torch.tensor([[False], [True], [False]]))
    result = cartpoles.reset(root)
    assert (result[keys.OBSERVATION][[0, 2]] == 5.0).all()
    assert result[keys.OBSERVATION][1].abs().max() < 0.05
    assert keys.RESET not in result


def test_reset_with_reset_key_keeps_the_other_sub_envs_flags(cartpoles: SerialEnv) -> None:
    root = cartpoles.reset()
    for name in (keys.DONE, keys.TERMINATED):
        root.set(name, torch.ones(3, 1, dtype=torch.bool))
    root.set(keys.RESET, torch.tensor([[True], [False], [False]]))
    result = cartpoles.reset(root)
    for name in (keys.DONE, keys.TERMINATED):
        assert result[name].flatten().tolist() == [False, True, True], name


def stateful_pendulum() -> EnvBase:
    """Pendulum whose transforms keep state in the root: step count, reward sum, frame window."""
    return TransformedEnv(
        GymEnv("Pendulum-v1"),
        Compose(
            StepCounter(max_steps=5),
            RewardSum(),
            CatFrames(N=2, dim=-1, in_keys=["observation"], out_keys=["stack"]),
        ),
    )


def zero_torque(td: TensorDictBase) -> TensorDictBase:
    return td.set(keys.ACTION, torch.zeros(*td.batch_size, 1))


def test_sub_env_transforms_keep_their_state_through_the_tensordict_face() -> None:
    single = stateful_pendulum()
    single.set_seed(0)
    expected = single.rollout(8, zero_torque, break_when_any_done=False)
    batched = SerialEnv(2, stateful_pendulum)
    batched.set_seed(0)
    result = batched.rollout(8, zero_torque, break_when_any_done=False)
    assert result["next", "step_count"][0].flatten().tolist() == [1, 2, 3, 4, 5, 1, 2, 3]
    for key in [("next", "episode_reward"), ("next", "stack"), ("next", "truncated")]:
        assert torch.equal(result[key][0], expected[key]), key
    batched.close()


def test_sub_batched_envs_and_masks() -> None:
    env = SerialEnv(2, lambda: CountingEnv(episode_length=[2, 3], batch_size=(2,)))
    assert env.batch_size == torch.Size([2, 2])
    assert env.set_seed(0) == 4
    carrier = allocate_carrier(env.full_spec, steps=3)
    env.bind(carrier)
    env.reset_into(0)
    for t in range(3):
        env.step_and_advance_into(t)
    counts = carrier.get(keys.OBSERVATION)[..., 0]
    assert counts.tolist() == [[[0, 1, 0, 1], [0, 1, 2, 0]]] * 2
    carrier.get(keys.OBSERVATION).fill_(7.0)
    env.reset_into(3, torch.tensor([[False, True], [False, False]]))
    assert carrier.get(keys.OBSERVATION)[..., 3, 0].tolist() == [[7.0, 0.0], [7.0, 7.0]]
    check_env(env, steps=8)
    env.close()


def test_create_env_fn_forms() -> None:
    per_worker = SerialEnv(
        2,
        [lambda g: gym.make("Pendulum-v1", g=g), lambda g: gym.make("Pendulum-v1", g=2 * g)],
        create_env_kwargs=[{"g": 3.0}, {"g": 4.0}],
    )
    assert [sub.gym_env.unwrapped.g for sub in per_worker.envs] == [3.0, 8.0]
    per_worker.close()
    wrapped = SerialEnv(2, lambda: gym.make("CartPole-v1"))
    assert all(isinstance(sub, GymEnv) for sub in wrapped.envs)
    wrapped.close()
    made = SerialEnv(2, "Pendulum-v1", create_env_kwargs={"g": 9.0})
    assert made.envs[1].gym_env.unwrapped.g == 9.0
    made.close()


def test_check_env_passes() -> None:
    env = SerialEnv(4, "CartPole-v1")
    check_env(env, steps=STEPS)
    env.close()


def test_close_is_idempotent_and_closes_the_sub_envs(cartpoles: SerialEnv) -> None:
    cartpoles.close()
    cartpoles.close()
    assert all(sub.is_closed for sub in cartpoles.envs)
    with pytest.raises(MisuseError, match="closed"):
        cartpoles.reset()


@pytest.mark.parametrize("num_workers", [0, -2, 1.5, True])
def test_num_workers_must_be_a_positive_int(num_workers: object) -> None:
    with pytest.raises(ValueError, match="num_workers must be a positive int"):
        SerialEnv(num_workers, "CartPole-v1")  # type: ignore[arg-type]


def test_argument_errors_name_the_argument() -> None:
    with pytest.raises(TypeError, match="create_env_fn must be a callable"):
        SerialEnv(2, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"create_env_fn='NoSuchEnv-v0' is not a registered"):
        SerialEnv(2, "NoSuchEnv-v0")
    with pytest.raises(ValueError, match="create_env_fn is a list of 1 entries"):
        SerialEnv(2, [CountingEnv])
    with pytest.raises(TypeError, match="create_env_kwargs must be a mapping"):
        SerialEnv(2, CountingEnv, create_env_kwargs=[1, 2])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="returned int"):
        SerialEnv(2, lambda: 3)


def test_sub_envs_with_different_specs_are_refused() -> None:
    with pytest.raises(ValueError, match=r"sub-env 1 has specs .* at key \('observation',\)"):
        SerialEnv(2, ["CartPole-v1", "Pendulum-v1"])
    with pytest.raises(ValueError, match="sub-env 1 has batch"):
        SerialEnv(2, [lambda: CountingEnv(batch_size=(2,)), CountingEnv])

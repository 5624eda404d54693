"""Tests for GymEnv and the Gymnasium space conversion, checked against TorchRL's GymEnv."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
import torchrl.envs
from tensordict import TensorDictBase
from torchrl.envs.libs.gym import _gym_to_torchrl_spec_transform

from rlcollect.envs import Binary, Bounded, Categorical, Composite, GymEnv, OneHot
from rlcollect.envs.gym_spaces import spec_from_space
from rlcollect.keys import ACTION, DONE, NEXT, OBSERVATION, REWARD, TERMINATED, TRUNCATED
from rlcollect.testing import check_env

spaces = gym.spaces


class DictObservationEnv(gym.Env):
    """A small seeded env with a nested Dict observation space and both kinds of episode end."""

    def __init__(self, horizon: int = 6) -> None:
        self.horizon = horizon
        self.observation_space = spaces.Dict(
            {
                "position": spaces.Box(-10.0, 10.0, (2,), np.float32),
                "goal": spaces.Discrete(4),
                "sensors": spaces.Dict(
                    {
                        "contact": spaces.MultiBinary(3),
                        "gauge": spaces.Box(0.0, 1.0, (1,), np.float64),
                    }
                ),
            }
        )
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self._position = self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)
        self._goal = int(self.np_random.integers(4))
        self._time = 0
        return self._observation(), {}

    def step(self, action: np.ndarray) -> tuple[Any, float, bool, bool, dict]:
        assert self.action_space.contains(action), action
        self._position = (self._position + action).astype(np.float32)
        self._time += 1
        terminated = bool(np.abs(self._position).max() > 2.0)
        truncated = self._time >= self.horizon
        return self._observation(), -float(np.abs(self._position).sum()), terminated, truncated, {}

    def _observation(self) -> dict:
        contact = (np.abs(self._position) > 1.0).astype(np.int8)
        gauge = np.array([self._time / self.horizon], dtype=np.float64)
        return {
            "position": self._position.copy(),
            "goal": self._goal,
            "sensors": {"contact": np.append(contact, np.int8(self._goal % 2)), "gauge": gauge},
        }


class RecordingEnv(gym.Env):
    """Records the actions it receives; observation and action spaces are given."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space) -> None:
        self.observation_space = observation_space
        self.action_space = action_space
        self.actions: list[Any] = []

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        return self.observation_space.sample(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        assert self.action_space.contains(action), action
        self.actions.append(action)
        return self.observation_space.sample(), 0.0, False, False, {}


def replay(actions: list[torch.Tensor]) -> Any:
    iterator = iter(actions)

    def policy(tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict.set(ACTION, next(iterator).clone())

    return policy


# --- the contract --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        ("CartPole-v1", {}),
        ("CartPole-v1", {"categorical_action_encoding": True}),
        ("Pendulum-v1", {"max_episode_steps": 15}),
        ("MountainCar-v0", {"max_episode_steps": 10}),
    ],
)
def test_check_env_passes_on_registered_envs(env_id: str, kwargs: dict) -> None:
    with GymEnv(env_id, **kwargs) as env:
        check_env(env, seed=1, steps=40)


def test_check_env_passes_on_dict_observations() -> None:
    with GymEnv(DictObservationEnv()) as env:
        check_env(env, steps=20)
        assert set(env.observation_keys) == {
            ("position",),
            ("goal",),
            ("sensors", "contact"),
            ("sensors", "gauge"),
        }
        root = env.reset()
        assert root["goal"].shape == torch.Size([4])
        assert root["sensors", "contact"].dtype == torch.int8
        assert root["sensors", "gauge"].dtype == torch.float64


def test_check_env_passes_on_tuple_and_multi_discrete_spaces() -> None:
    observation_space = spaces.Tuple((spaces.Discrete(3), spaces.Box(-1.0, 1.0, (2,))))
    action_space = spaces.MultiDiscrete([2, 3])
    with GymEnv(RecordingEnv(observation_space, action_space)) as env:
        check_env(env, steps=6)
        assert set(env.observation_keys) == {(OBSERVATION, "0"), (OBSERVATION, "1")}
        assert isinstance(env.action_spec, Categorical)


# --- against TorchRL -----------------------------------------------------------------------------


def assert_same_rollout(ours: TensorDictBase, reference: TensorDictBase) -> None:
    assert ours.batch_size == reference.batch_size
    assert ours.names == reference.names
    assert set(ours.keys(True, True)) == set(reference.keys(True, True))
    for key in reference.keys(True, True):
        assert ours[key].shape == reference[key].shape, key
        assert ours[key].dtype == reference[key].dtype, key
        assert torch.equal(ours[key], reference[key]), key


def rollouts_of_both(
    ours: GymEnv, reference: Any, steps: int, seed: int, break_when_any_done: bool = False
) -> tuple[Any, Any]:
    torch.manual_seed(seed)
    actions = [ours.action_spec.rand() for _ in range(steps)]
    results = []
    assert ours.set_seed(seed) == seed + 1  # TorchRL returns a hash of the seed instead
    reference.set_seed(seed)
    for env in (ours, reference):
        results.append(env.rollout(steps, replay(actions), break_when_any_done=break_when_any_done))
    return results[0], results[1]


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        ("CartPole-v1", {}),
        ("CartPole-v1", {"categorical_action_encoding": True}),
        ("Pendulum-v1", {}),
        ("Pendulum-v1", {"max_episode_steps": 7}),
    ],
)
def test_rollout_matches_torchrl(env_id: str, kwargs: dict) -> None:
    ours, reference = GymEnv(env_id, **kwargs), torchrl.envs.GymEnv(env_id, **kwargs)
    data, expected = rollouts_of_both(ours, reference, steps=60, seed=3)
    assert_same_rollout(data, expected)
    if env_id == "CartPole-v1":
        assert data[NEXT, TERMINATED].any()
    if "max_episode_steps" in kwargs:
        assert data[NEXT, TRUNCATED].flatten().nonzero().flatten().tolist() == list(range(6, 60, 7))
    ours.close()
    reference.close()


def test_rollout_to_the_first_done_matches_torchrl() -> None:
    ours, reference = GymEnv("CartPole-v1"), torchrl.envs.GymEnv("CartPole-v1")
    data, expected = rollouts_of_both(ours, reference, 200, seed=4, break_when_any_done=True)
    assert_same_rollout(data, expected)
    assert data.batch_size[0] < 200
    assert data[NEXT, DONE].flatten().nonzero().flatten().tolist() == [data.batch_size[0] - 1]
    ours.close()
    reference.close()


def test_dict_observation_rollout_matches_torchrl() -> None:
    ours = GymEnv(DictObservationEnv())
    reference = torchrl.envs.GymWrapper(DictObservationEnv())
    data, expected = rollouts_of_both(ours, reference, steps=40, seed=5)
    assert_same_rollout(data, expected)
    assert data[NEXT, TRUNCATED].any()
    assert data[NEXT, TERMINATED].any()


def test_specs_match_torchrl() -> None:
    ours, reference = GymEnv("CartPole-v1"), torchrl.envs.GymEnv("CartPole-v1")
    for name in ("observation_spec", "reward_spec"):
        for key, spec in (
            getattr(ours, name).leaves() if name == "observation_spec" else [((), ours.reward_spec)]
        ):
            other = getattr(reference, name)[key] if key else reference.reward_spec
            assert (spec.shape, spec.dtype) == (other.shape, other.dtype), key
    for flag in (DONE, TERMINATED, TRUNCATED):
        assert ours.done_spec[flag].shape == reference.full_done_spec[flag].shape
        assert ours.done_spec[flag].dtype == reference.full_done_spec[flag].dtype


# --- the buffer face -----------------------------------------------------------------------------


def test_discrete_observation_is_written_one_hot() -> None:
    env = GymEnv(RecordingEnv(spaces.Discrete(5), spaces.Discrete(2)))
    data = env.rollout(6)
    assert data[OBSERVATION].shape == torch.Size([6, 5])
    assert (data[OBSERVATION].sum(-1) == 1).all()
    assert env.observation_spec[OBSERVATION].is_in(data[OBSERVATION][0])


def test_one_hot_and_categorical_actions_reach_the_gym_env() -> None:
    for categorical in (False, True):
        inner = RecordingEnv(spaces.Box(-1.0, 1.0, (1,)), spaces.Discrete(3))
        env = GymEnv(inner, categorical_action_encoding=categorical)
        root = env.reset()
        for index in (2, 0, 1):
            action = torch.tensor(index) if categorical else torch.eye(3, dtype=torch.int64)[index]
            root[ACTION] = action
            _, root = env.step_and_maybe_reset(root)
        assert inner.actions == [2, 0, 1]


@pytest.mark.parametrize(
    ("observation_space", "action_space"),
    [
        (spaces.Discrete(3, start=-1), spaces.Discrete(3, start=5)),
        (spaces.MultiDiscrete([2, 3], start=[1, -2]), spaces.MultiDiscrete([2, 4], start=[3, 0])),
    ],
    ids=["discrete", "multi_discrete"],
)
def test_spaces_with_a_start_are_shifted_to_zero_based_indices(
    observation_space: gym.Space, action_space: gym.Space
) -> None:
    inner = RecordingEnv(observation_space, action_space)
    with GymEnv(inner) as env:
        check_env(env, steps=6)
        assert len(inner.actions) > 0


def test_check_env_passes_on_scalar_box_observations() -> None:
    space = spaces.Box(-1.0, 1.0, (), np.float32)
    with GymEnv(RecordingEnv(space, spaces.Discrete(2))) as env:
        assert env.observation_spec[OBSERVATION].shape == torch.Size([])
        check_env(env, steps=6)


def test_reward_and_flags_have_torchrl_layout() -> None:
    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    # CartPole truncates at step 500, so the rollout ends on a done whatever actions are drawn.
    data = env.rollout(500)
    assert data[NEXT, REWARD].dtype == torch.float32
    assert data[NEXT, REWARD].shape == torch.Size([data.batch_size[0], 1])
    assert data[NEXT, DONE][-1].item()
    assert not data[NEXT, DONE][:-1].any()


def test_gym_env_refuses_a_non_cpu_carrier() -> None:
    env = GymEnv("CartPole-v1")
    carrier = env._scratch_carrier().to("meta")
    with pytest.raises(ValueError, match="GymEnv writes through NumPy views and needs a CPU"):
        env.bind(carrier)


# --- errors --------------------------------------------------------------------------------------


def test_unknown_id_is_named() -> None:
    with pytest.raises(ValueError, match=r"env='NoSuchEnv-v0' is not a registered Gymnasium"):
        GymEnv("NoSuchEnv-v0")
    with pytest.raises(ValueError, match=r"check the spelling and version suffix"):
        GymEnv("CartPole-v99")


def test_vector_env_is_refused() -> None:
    vector_env = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")])
    with pytest.raises(TypeError, match="env is a Gymnasium vector env"):
        GymEnv(vector_env)  # type: ignore[arg-type]
    vector_env.close()


def test_non_env_is_refused() -> None:
    with pytest.raises(TypeError, match=r"env must be a Gymnasium id or a gymnasium\.Env; got int"):
        GymEnv(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("observation_space", "action_space", "match"),
    [
        (spaces.Text(5), spaces.Discrete(2), r"Gymnasium space Text\(.*\) is not supported"),
        (
            spaces.Box(-1.0, 1.0, (1,)),
            spaces.Dict({"a": spaces.Discrete(2)}),
            "actions must be one tensor",
        ),
        (spaces.Box(-1.0, 1.0, (1,)), spaces.Graph(spaces.Discrete(2), None), "is not supported"),
    ],
)
def test_unsupported_space_is_refused(
    observation_space: gym.Space, action_space: gym.Space, match: str
) -> None:
    with pytest.raises(TypeError, match=match):
        GymEnv(RecordingEnv(observation_space, action_space))


def test_closed_gym_env_refuses_to_step() -> None:
    from rlcollect.errors import MisuseError

    env = GymEnv("CartPole-v1")
    root = env.reset()
    env.close()
    with pytest.raises(MisuseError, match="GymEnv is closed"):
        env.step(env.rand_action(root))
    env.close()


# --- space conversion ----------------------------------------------------------------------------

SPACES = {
    "box": (spaces.Box(-2.0, 3.0, (3,), np.float32), Bounded, (3,), torch.float32),
    "box_uint8": (spaces.Box(0, 255, (2, 2), np.uint8), Bounded, (2, 2), torch.uint8),
    "box_unbounded": (spaces.Box(-np.inf, np.inf, (2,), np.float64), Bounded, (2,), torch.float64),
    "box_lower_half": (spaces.Box(-np.inf, 0.0, (4,), np.float32), Bounded, (4,), torch.float32),
    "discrete": (spaces.Discrete(5), OneHot, (5,), torch.int64),
    "multi_discrete": (spaces.MultiDiscrete([3, 4]), Categorical, (2,), torch.int64),
    "multi_discrete_2d": (spaces.MultiDiscrete([[2, 3], [4, 5]]), Categorical, (2, 2), torch.int64),
    "multi_binary": (spaces.MultiBinary(4), Binary, (4,), torch.int8),
    "multi_binary_2d": (spaces.MultiBinary([2, 3]), Binary, (2, 3), torch.int8),
}


def as_tensor(value: Any) -> torch.Tensor:
    return torch.as_tensor(np.asarray(value))


@pytest.mark.parametrize("name", list(SPACES))
def test_space_conversion_rand_zero_is_in(name: str) -> None:
    space, spec_class, shape, dtype = SPACES[name]
    spec = spec_from_space(space)
    assert type(spec) is spec_class
    assert spec.shape == torch.Size(shape)
    assert spec.dtype == dtype
    for _ in range(20):
        assert spec.is_in(spec.rand())
        assert space.contains(spec.rand().numpy()) or spec_class is OneHot
    assert spec.rand((7,)).shape == torch.Size([7, *shape])
    assert spec.zero().shape == torch.Size(shape)
    assert spec.zero().dtype == dtype
    if spec_class is not OneHot:
        assert spec.is_in(spec.zero())
        space.seed(0)
        assert spec.is_in(as_tensor(space.sample()))
    assert not spec.is_in(spec.rand().to(torch.float16))
    assert not spec.is_in(torch.zeros(9, dtype=dtype))


def test_discrete_conversion_both_encodings() -> None:
    space = spaces.Discrete(4)
    one_hot = spec_from_space(space)
    categorical = spec_from_space(space, categorical_action_encoding=True)
    assert isinstance(categorical, Categorical)
    assert categorical.shape == torch.Size([])
    assert categorical.is_in(torch.tensor(3))
    assert not categorical.is_in(torch.tensor(4))
    assert categorical.is_in(categorical.zero())
    assert one_hot.is_in(torch.tensor([0, 0, 1, 0]))
    assert not one_hot.is_in(torch.tensor([0, 1, 1, 0]))
    assert not one_hot.is_in(one_hot.zero())


def test_box_conversion_keeps_bounds() -> None:
    low, high = np.array([0.0, -1.0], np.float32), np.array([1.0, 5.0], np.float32)
    spec = spec_from_space(spaces.Box(low, high, dtype=np.float32))
    assert spec.is_in(torch.tensor([1.0, 5.0]))
    assert not spec.is_in(torch.tensor([1.0, 5.5]))
    assert spec.zero().tolist() == [0.0, 0.0]
    shifted = spec_from_space(spaces.Box(1.0, 2.0, (2,), np.float32))
    assert shifted.zero().tolist() == [1.0, 1.0]


def test_multi_discrete_and_multi_binary_domains() -> None:
    multi_discrete = spec_from_space(spaces.MultiDiscrete([2, 3]))
    assert multi_discrete.is_in(torch.tensor([1, 2]))
    assert not multi_discrete.is_in(torch.tensor([2, 2]))
    multi_binary = spec_from_space(spaces.MultiBinary(3))
    assert multi_binary.is_in(torch.tensor([0, 1, 1], dtype=torch.int8))
    assert not multi_binary.is_in(torch.tensor([0, 2, 1], dtype=torch.int8))


def test_dict_and_tuple_conversion() -> None:
    space = spaces.Dict(
        {
            "a": spaces.Box(-1.0, 1.0, (2,), np.float32),
            "b": spaces.Tuple((spaces.Discrete(3), spaces.MultiBinary(2))),
        }
    )
    spec = spec_from_space(space, categorical_action_encoding=True)
    assert isinstance(spec, Composite)
    assert isinstance(spec["b"], Composite)
    assert set(spec.keys(include_nested=True, leaves_only=True)) == {
        "a",
        ("b", "0"),
        ("b", "1"),
    }
    value = spec.rand()
    assert spec.is_in(value)
    assert value["b", "0"].shape == torch.Size([])
    assert spec.is_in(spec.zero())
    value["a"] = torch.full((2,), 5.0)
    assert not spec.is_in(value)
    assert spec.rand((3,)).batch_size == torch.Size([3])


TORCHRL_PARITY = [
    (spaces.Box(-1.0, 1.0, (3,), np.float32), False),
    (spaces.Box(0, 255, (2, 2), np.uint8), False),
    (spaces.Discrete(5), False),
    (spaces.Discrete(5), True),
    (spaces.MultiDiscrete([3, 3]), True),
    (spaces.MultiBinary(4), False),
]


@pytest.mark.parametrize(("space", "categorical"), TORCHRL_PARITY)
def test_conversion_matches_torchrl_shapes_and_dtypes(space: gym.Space, categorical: bool) -> None:
    reference = _gym_to_torchrl_spec_transform(
        space, device="cpu", categorical_action_encoding=categorical
    )
    ours = spec_from_space(space, categorical_action_encoding=categorical)
    assert (ours.shape, ours.dtype) == (reference.shape, reference.dtype)


def test_known_divergences_from_torchrl_conversion() -> None:
    # TorchRL one-hot encodes MultiDiscrete without categorical encoding; we keep the indices.
    multi_discrete = spaces.MultiDiscrete([3, 4])
    reference = _gym_to_torchrl_spec_transform(multi_discrete, device="cpu")
    assert reference.shape == torch.Size([7])
    assert spec_from_space(multi_discrete).shape == torch.Size([2])
    # TorchRL gives a scalar Box the shape [1]; we keep the Box's shape.
    scalar = spaces.Box(-5, 5, (), np.int64)
    assert _gym_to_torchrl_spec_transform(scalar, device="cpu").shape == torch.Size([1])
    assert spec_from_space(scalar).shape == torch.Size([])

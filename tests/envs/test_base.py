"""Tests for EnvBase: the derived buffer face of TensorDict-first envs, class checks, closing."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from rlcollect.envs import (
    Bounded,
    Categorical,
    Composite,
    EnvBase,
    GymEnv,
    Unbounded,
    allocate_carrier,
)
from rlcollect.errors import MisuseError
from rlcollect.keys import (
    ACTION,
    DONE,
    DONE_KEYS,
    NEXT,
    OBSERVATION,
    RESET,
    REWARD,
    TERMINATED,
    TRUNCATED,
)
from rlcollect.testing import CountingEnv, TensorDictCountingEnv, check_env

POSITION = ("agent", "position")


class RandomWalkEnv(EnvBase):
    """A TensorDict-first batched env with a nested observation key, seeded random resets,
    terminations when a walker leaves [-2, 2] and truncation after `horizon` steps."""

    def __init__(self, batch_size: tuple = (3,), horizon: int = 6) -> None:
        super().__init__(batch_size=batch_size)
        self.horizon = horizon
        batch = self.batch_size
        self.observation_spec = Composite(
            {
                "agent": Composite({"position": Unbounded(shape=(*batch, 2))}, shape=batch),
                "clock": Bounded(0, horizon, shape=(*batch, 1), dtype=torch.int64),
            },
            shape=batch,
        )
        self.action_spec = Bounded(-1.0, 1.0, shape=(*batch, 2))
        self.reward_spec = Unbounded(shape=(*batch, 1))
        flag = Categorical(2, shape=(*batch, 1), dtype=torch.bool)
        self.done_spec = Composite(dict.fromkeys(DONE_KEYS, flag), shape=batch)
        self.generator = torch.Generator().manual_seed(0)
        self.position = torch.zeros(*batch, 2)
        self.clock = torch.zeros(*batch, 1, dtype=torch.int64)

    def _reset(self, tensordict: TensorDictBase | None) -> TensorDictBase:
        selected = torch.ones(*self.batch_size, 1, dtype=torch.bool)
        if tensordict is not None and RESET in tensordict:
            selected = tensordict.get(RESET).reshape(*self.batch_size, 1)
        start = torch.rand(*self.batch_size, 2, generator=self.generator) - 0.5
        self.position = torch.where(selected, start, self.position)
        self.clock = torch.where(selected, 0, self.clock)
        flags = torch.zeros(*self.batch_size, 1, dtype=torch.bool)
        return self._observation().update(dict.fromkeys(DONE_KEYS, flags))

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self.position = self.position + tensordict.get(ACTION)
        self.clock = self.clock + 1
        terminated = self.position.abs().amax(-1, keepdim=True) > 2.0
        truncated = (self.clock >= self.horizon) & ~terminated
        result = self._observation()
        result.update(
            {
                REWARD: -self.position.norm(dim=-1, keepdim=True),
                DONE: terminated | truncated,
                TERMINATED: terminated,
                TRUNCATED: truncated,
            }
        )
        return result

    def _observation(self) -> TensorDictBase:
        return TensorDict(
            {POSITION: self.position.clone(), "clock": self.clock.clone()},
            batch_size=self.batch_size,
        )

    def _set_seed(self, seed: int) -> int:
        self.generator.manual_seed(seed)
        return seed + self.batch_size.numel()


# --- the derived buffer face ---------------------------------------------------------------------


def test_tensordict_first_env_passes_check_env() -> None:
    check_env(RandomWalkEnv(batch_size=(3,)), steps=30)
    check_env(RandomWalkEnv(batch_size=(2, 2)), steps=30)
    check_env(RandomWalkEnv(batch_size=()), steps=30)


def test_tensordict_first_env_buffer_face_writes_what_rollout_returns() -> None:
    env = RandomWalkEnv(batch_size=(4,))
    torch.manual_seed(0)
    actions = [env.action_spec.rand() for _ in range(20)]
    env.set_seed(3)
    iterator = iter(actions)
    expected = env.rollout(20, lambda td: td.set(ACTION, next(iterator)), break_when_any_done=False)
    assert expected[NEXT, DONE].any()

    carrier = allocate_carrier(env.full_spec, steps=20)
    env.set_seed(3)
    env.bind(carrier)
    env.reset_into(0)
    for t, action in enumerate(actions):
        carrier[ACTION][:, t] = action
        env.step_and_advance_into(t)
    for key in expected.keys(include_nested=True, leaves_only=True):
        assert torch.equal(carrier[key][:, :20], expected[key]), key
    # the root after a done step holds a fresh reset: clock back to 0
    done = carrier[NEXT, DONE][:, :20, 0]
    assert (carrier["clock"][:, 1:][done] == 0).all()
    assert (carrier["clock"][:, 1:][~done] == carrier[NEXT, "clock"][:, :20][~done]).all()


def test_derived_reset_into_with_mask_keeps_other_sub_envs() -> None:
    env = RandomWalkEnv(batch_size=(3,))
    carrier = allocate_carrier(env.full_spec, steps=2)
    env.bind(carrier)
    env.reset_into(0)
    carrier[ACTION][:, 0] = 0.25
    env.step_and_advance_into(0)
    before = carrier.clone()
    env.reset_into(1, torch.tensor([False, True, False]))
    assert carrier["clock"][:, 1, 0].tolist() == [1, 0, 1]
    assert torch.equal(carrier[POSITION][[0, 2], 1], before[POSITION][[0, 2], 1])
    assert not torch.equal(carrier[POSITION][1, 1], before[POSITION][1, 1])


def test_carrier_of_the_wrong_batch_is_refused() -> None:
    env = CountingEnv(batch_size=(3,))
    carrier = allocate_carrier(CountingEnv(batch_size=(2,)).full_spec, steps=4)
    with pytest.raises(ValueError, match=r"carrier batch \(2, 5\) does not match the env batch"):
        env.bind(carrier)


@pytest.mark.parametrize("env_class", [CountingEnv, TensorDictCountingEnv])
def test_buffer_face_without_carrier_is_misuse(env_class: type) -> None:
    env = env_class()
    with pytest.raises(MisuseError, match=r"has no carrier bound; call env\.bind"):
        EnvBase.step_into(env, 0)


# --- class creation ------------------------------------------------------------------------------


def test_subclass_implementing_neither_face_is_refused() -> None:
    with pytest.raises(TypeError, match="FacelessEnv must implement one face of EnvBase"):

        class FacelessEnv(EnvBase):
            def _set_seed(self, seed: int) -> int:
                return seed


def test_abstract_intermediate_class_is_allowed() -> None:
    class MyEnvFamily(EnvBase):
        _abstract = True

    class Concrete(MyEnvFamily):
        def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
            return tensordict

    assert issubclass(Concrete, EnvBase)


# --- the TensorDict face -------------------------------------------------------------------------


def test_full_spec_holds_root_and_next_keys() -> None:
    spec = RandomWalkEnv(batch_size=(2,)).full_spec
    assert set(spec.keys(include_nested=True, leaves_only=True)) == {
        POSITION,
        "clock",
        ACTION,
        *DONE_KEYS,
        (NEXT, *POSITION),
        (NEXT, "clock"),
        (NEXT, REWARD),
        *((NEXT, name) for name in DONE_KEYS),
    }
    assert spec[NEXT, REWARD].shape == torch.Size([2, 1])


@pytest.mark.parametrize("env_class", [CountingEnv, TensorDictCountingEnv])
@pytest.mark.parametrize("mask_shape", [(3, 1), (3,)])
def test_reset_mask_may_carry_the_trailing_flag_dim(env_class: type, mask_shape: tuple) -> None:
    env = env_class(episode_length=10, batch_size=(3,))
    root = env.reset()
    _, root = env.step_and_maybe_reset(env.rand_action(root))
    root[RESET] = torch.tensor([True, False, True]).reshape(mask_shape)
    result = env.reset(root)
    assert result[OBSERVATION].flatten().tolist() == [0.0, 1.0, 0.0]
    assert RESET not in result


@pytest.mark.parametrize("env_class", [CountingEnv, TensorDictCountingEnv])
def test_step_and_maybe_reset_resets_only_done_sub_envs(env_class: type) -> None:
    env = env_class(episode_length=[1, 3], batch_size=(2,))
    root = env.reset()
    observed = []
    for _ in range(3):
        step, root = env.step_and_maybe_reset(env.rand_action(root))
        observed.append(
            (step[NEXT, OBSERVATION].flatten().tolist(), root[OBSERVATION].flatten().tolist())
        )
    assert observed == [([1, 1], [0, 1]), ([1, 2], [0, 2]), ([1, 3], [0, 0])]


def test_rollout_stops_at_first_done_or_goes_on() -> None:
    env = CountingEnv(episode_length=[2, 4], batch_size=(2,))
    assert env.rollout(10).batch_size == torch.Size([2, 2])
    data = env.rollout(10, break_when_any_done=False)
    assert data.batch_size == torch.Size([2, 10])
    assert data.names == [None, "time"]


def test_rollout_from_a_given_root() -> None:
    env = CountingEnv(episode_length=5)
    root = env.reset()
    _, root = env.step_and_maybe_reset(env.rand_action(root))
    data = env.rollout(3, auto_reset=False, tensordict=root)
    assert data[OBSERVATION].flatten().tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="needs the starting `tensordict`"):
        env.rollout(3, auto_reset=False)
    with pytest.raises(ValueError, match="max_steps must be >= 1; got 0"):
        env.rollout(0)


def test_rand_action_follows_the_action_spec() -> None:
    env = RandomWalkEnv(batch_size=(5,))
    action = env.rand_action()[ACTION]
    assert action.shape == torch.Size([5, 2])
    assert env.action_spec.is_in(action)


def test_env_without_seeding_says_so() -> None:
    class Unseeded(TensorDictCountingEnv):
        _set_seed = EnvBase._set_seed

    with pytest.raises(NotImplementedError, match="Unseeded does not support seeding"):
        Unseeded().set_seed(0)


# --- closing -------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_class", [CountingEnv, TensorDictCountingEnv, RandomWalkEnv])
def test_closed_env_refuses_to_reset_step_seed_or_bind(env_class: type) -> None:
    env = env_class()
    root = env.rand_action(env.reset())
    carrier = allocate_carrier(env.full_spec, steps=2)
    env.close()
    assert env.is_closed
    with pytest.raises(MisuseError, match=f"{env_class.__name__} is closed; create a new env"):
        env.step(root)
    with pytest.raises(MisuseError, match="is closed"):
        env.reset()
    with pytest.raises(MisuseError, match="is closed"):
        env.step_and_maybe_reset(root)
    with pytest.raises(MisuseError, match="is closed"):
        env.set_seed(0)
    with pytest.raises(MisuseError, match="is closed"):
        env.bind(carrier)
    env.close()


@pytest.mark.parametrize(
    "make_env", [CountingEnv, TensorDictCountingEnv, RandomWalkEnv, lambda: GymEnv("CartPole-v1")]
)
def test_closed_env_refuses_the_buffer_face(make_env: Callable[[], EnvBase]) -> None:
    env = make_env()
    carrier = allocate_carrier(env.full_spec, steps=2)
    env.bind(carrier)
    env.reset_into(0)
    env.close()
    with pytest.raises(MisuseError, match="is closed"):
        env.step_into(0)
    with pytest.raises(MisuseError, match="is closed"):
        env.step_and_advance_into(0)
    with pytest.raises(MisuseError, match="is closed"):
        env.reset_into(0)


def test_context_manager_closes() -> None:
    with CountingEnv() as env:
        env.rollout(2)
    assert env.is_closed
    assert repr(env) == "CountingEnv(batch_size=(), device=cpu)"


def test_step_without_action_names_the_missing_key() -> None:
    env = GymEnv("CartPole-v1")
    root = env.reset()
    with pytest.raises(
        KeyError, match=r"step needs the action entries \['action'\]; the TensorDict has"
    ):
        env.step(root)

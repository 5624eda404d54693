"""Tests for rlcollect.testing.check_env: conforming envs pass, each broken clause is named."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from rlcollect.envs import Bounded, Composite, EnvBase, Unbounded
from rlcollect.errors import EnvContractError
from rlcollect.keys import DONE, NEXT, OBSERVATION, REWARD, TRUNCATED
from rlcollect.testing import CountingEnv, TensorDictCountingEnv, check_env


@pytest.mark.parametrize("env_class", [CountingEnv, TensorDictCountingEnv])
@pytest.mark.parametrize(
    ("episode_length", "batch_size"),
    [(1, ()), (3, ()), ([2, 3, 5], (3,)), ([[1, 2], [3, 4]], (2, 2))],
)
def test_conforming_envs_pass(env_class: type, episode_length: object, batch_size: tuple) -> None:
    check_env(env_class(episode_length=episode_length, batch_size=batch_size), steps=12)


def test_check_env_refuses_non_env_and_short_runs() -> None:
    with pytest.raises(TypeError, match="check_env checks rlcollect envs; got a dict"):
        check_env({})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="steps must be >= 2"):
        check_env(CountingEnv(), steps=1)


# --- envs that break one clause each -------------------------------------------------------------


class WrongDtypeEnv(TensorDictCountingEnv):
    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        result = super()._step(tensordict)
        return result.set(OBSERVATION, result.get(OBSERVATION).double())


class WrongShapeEnv(TensorDictCountingEnv):
    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        result = super()._step(tensordict)
        return result.set(OBSERVATION, result.get(OBSERVATION).expand(*self.batch_size, 2))


class MissingTruncatedEnv(TensorDictCountingEnv):
    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        return super()._step(tensordict).exclude(TRUNCATED)


class DoneNeverSetEnv(TensorDictCountingEnv):
    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        result = super()._step(tensordict)
        return result.set(DONE, torch.zeros_like(result.get(DONE)))


class ResetKeepsCountEnv(TensorDictCountingEnv):
    """A broken reset: the count goes on, so the episode after the first leaves the spec."""

    def _reset(self, tensordict: TensorDictBase | None) -> TensorDictBase:
        count = self._count.clone()
        result = super()._reset(tensordict)
        self._count.copy_(count)
        return result.set(OBSERVATION, count)


class ResetSetsDoneEnv(TensorDictCountingEnv):
    def _reset(self, tensordict: TensorDictBase | None) -> TensorDictBase:
        result = super()._reset(tensordict)
        return result.set(DONE, torch.ones_like(result.get(DONE)))


class ResetIgnoresMaskEnv(TensorDictCountingEnv):
    def _reset(self, tensordict: TensorDictBase | None) -> TensorDictBase:
        return super()._reset(None)


class ReturnsInternalBufferEnv(TensorDictCountingEnv):
    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        return super()._step(tensordict).set(OBSERVATION, self._count)


class UnseededNoiseEnv(TensorDictCountingEnv):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.observation_spec = Composite(
            {OBSERVATION: Unbounded(shape=(*self.batch_size, 1))}, shape=self.batch_size
        )

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        result = super()._step(tensordict)
        return result.set(OBSERVATION, torch.rand(*self.batch_size, 1))


class NoSeedEnv(EnvBase):
    """A TensorDict-first env that does not implement `_set_seed`."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = TensorDictCountingEnv()
        self.observation_spec = self.inner.observation_spec
        self.action_spec = self.inner.action_spec
        self.reward_spec = self.inner.reward_spec
        self.done_spec = self.inner.done_spec

    def _reset(self, tensordict: TensorDictBase | None) -> TensorDictBase:
        return self.inner._reset(tensordict)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self.inner._step(tensordict)


class SeedReturnsNoneEnv(TensorDictCountingEnv):
    def _set_seed(self, seed: int) -> int:
        return None  # type: ignore[return-value]


class FusedStepForgetsRewardEnv(CountingEnv):
    """A buffer-first env whose fused fast path drifts from its TensorDict face."""

    def step_and_advance_into(self, t: int) -> None:
        self.step_into(t)
        self._reward[..., t, :] = 0.0
        self.advance_into(t)


class AdvanceForgetsResetEnv(CountingEnv):
    def advance_into(self, t: int) -> None:
        self._observation[..., t + 1, :] = self._next_observation[..., t, :]


class NoResetAfterDoneEnv(TensorDictCountingEnv):
    def step_and_maybe_reset(
        self, tensordict: TensorDictBase
    ) -> tuple[TensorDictBase, TensorDictBase]:
        tensordict = self.step(tensordict)
        root = tensordict.get(NEXT).select(OBSERVATION, *self.done_keys).clone()
        return tensordict, root


class RolloutWithoutNamesEnv(CountingEnv):
    def rollout(self, max_steps: int, *args: object, **kwargs: object) -> TensorDictBase:
        data = super().rollout(max_steps, *args, **kwargs)  # type: ignore[arg-type]
        data.names = None
        return data


class RolloutIgnoresBreakEnv(CountingEnv):
    def rollout(self, max_steps: int, *args: object, **kwargs: object) -> TensorDictBase:
        kwargs["break_when_any_done"] = False
        return super().rollout(max_steps, *args, **kwargs)  # type: ignore[arg-type]


class UnbatchedSpecEnv(CountingEnv):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.observation_spec = Composite({OBSERVATION: Bounded(0.0, 5.0, shape=(1,))})


class FloatDoneSpecEnv(CountingEnv):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.done_spec = Composite({name: Unbounded(shape=(1,)) for name in self.done_spec})


class ObservationNamedRewardEnv(CountingEnv):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.observation_spec = Composite({REWARD: Unbounded(shape=(1,))})


class ResetReturnsDictEnv(TensorDictCountingEnv):
    def _reset(self, tensordict: TensorDictBase | None) -> TensorDictBase:
        return super()._reset(tensordict).to_dict()  # type: ignore[return-value]


BROKEN_ENVS = [
    (WrongDtypeEnv, (), r"step\(\): key \('next', 'observation'\) has dtype torch.float64"),
    (
        WrongShapeEnv,
        (),
        r"step\(\): key \('next', 'observation'\) has shape \(2,\); expected \(1,\)",
    ),
    (MissingTruncatedEnv, (), r"step\(\): key \('next', 'truncated'\) is missing"),
    (DoneNeverSetEnv, (), r"\('next', 'done'\) must equal terminated \| truncated"),
    (ResetKeepsCountEnv, (), r"key \('next', 'observation'\) holds values outside its spec"),
    (ResetSetsDoneEnv, (), r"reset\(\): flag 'done' is set"),
    (
        ResetIgnoresMaskEnv,
        (3,),
        r"reset\(\) with '_reset' = \[True, False, False\]: key "
        r"'observation' changed for sub-envs that were not asked to reset",
    ),
    (
        ReturnsInternalBufferEnv,
        (),
        r"step\(\): the value of key \('next', 'observation'\) it "
        r"returned changed when the env stepped again",
    ),
    (
        UnseededNoiseEnv,
        (),
        r"two runs from set_seed\(0\) with the same actions: key "
        r"\('next', 'observation'\) differs, first at time step 0",
    ),
    (SeedReturnsNoneEnv, (), r"set_seed\(0\) returned None"),
    (
        FusedStepForgetsRewardEnv,
        (2,),
        r"buffer face \(reset_into, step_and_advance_into\) vs "
        r"TensorDict face: key \('next', 'reward'\) differs, first at time step 0",
    ),
    (
        AdvanceForgetsResetEnv,
        (),
        r"buffer face \(reset_into, step_and_advance_into\) vs "
        r"TensorDict face: key 'observation' differs, first at time step 3",
    ),
    (
        NoResetAfterDoneEnv,
        (),
        r"step_and_maybe_reset\(\) at step 2: the root it returned has "
        r"flag 'done' set",
    ),
    (RolloutWithoutNamesEnv, (), r"the last batch dim must be named 'time'; got names \[None\]"),
    (
        RolloutIgnoresBreakEnv,
        (),
        r"break_when_any_done=True\) ran 12 steps with done at steps "
        r"\[2, 5, 8, 11\]; it must stop right after the first done",
    ),
    (
        UnbatchedSpecEnv,
        (4,),
        r"the spec of key 'observation' has shape \(1,\), which does not "
        r"start with the env batch size \(4,\)",
    ),
    (FloatDoneSpecEnv, (), r"env.done_spec must hold 'done' with dtype torch.bool"),
    (ObservationNamedRewardEnv, (), r"observation keys \['reward'\] clash"),
    (ResetReturnsDictEnv, (), r"reset\(\): returned a dict; expected a TensorDict"),
]


@pytest.mark.parametrize(
    ("env_class", "batch_size", "match"),
    BROKEN_ENVS,
    ids=[env_class.__name__ for env_class, _, _ in BROKEN_ENVS],
)
def test_broken_env_is_caught_with_the_key_named(
    env_class: type, batch_size: tuple, match: str
) -> None:
    env = env_class(episode_length=3, batch_size=batch_size)
    with pytest.raises(EnvContractError, match=match):
        check_env(env, steps=12)


def test_env_without_seeding_is_told_how_to_add_it() -> None:
    with pytest.raises(EnvContractError, match=r"set_seed\(0\) is not implemented.*_set_seed"):
        check_env(NoSeedEnv(), steps=4)


def test_error_is_an_assertion_error_for_test_frameworks() -> None:
    with pytest.raises(AssertionError):
        check_env(WrongDtypeEnv(), steps=4)


def test_values_differ_message_names_time_step() -> None:
    from rlcollect.testing.assertions import assert_same_values

    expected = TensorDict({"x": torch.zeros(2, 4)}, batch_size=[2, 4])
    got = expected.clone()
    got["x"][1, 2] = 5.0
    with pytest.raises(
        EnvContractError,
        match=r"key 'x' differs, first at time step 2: got "
        r"\[0.0, 5.0\], expected \[0.0, 0.0\]",
    ):
        assert_same_values("here", expected, got, ["x"], time_dim=1)

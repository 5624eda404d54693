"""Conformance of the two implementations of TorchRL's step count and truncation.

`StepCounter(max_steps)` is the TensorDict transform; `StepLimit(env, max_steps)` is its
buffer-first twin, which collectors wrap the env in for `max_frames_per_traj`. Both run here on
the same envs with the same actions, each through the faces it is driven by, and must agree step
by step with the reference, `StepCounter` through the TensorDict face (checked against TorchRL's
own `StepCounter` in test_step_counter.py): step counts, done / terminated / truncated flags, and
resets (the observations show where each sub-env restarted). The reference is also checked
against the rule itself, so that the two cannot drift together.

The envs end their episodes before the limit (terminated), at it (terminated and truncated on
the same step) and after it (truncated), batched or not, with and without a truncated flag of
their own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import pytest
import torch
from tensordict import TensorDictBase

from rlcollect.envs import Composite, EnvBase, GymEnv, GymVectorEnv, SerialEnv, allocate_carrier
from rlcollect.keys import (
    ACTION,
    DONE,
    NEXT,
    OBSERVATION,
    REWARD,
    STEP_COUNT,
    TERMINATED,
    TRUNCATED,
)
from rlcollect.testing import CountingEnv, TensorDictCountingEnv
from rlcollect.transforms import StepCounter, TransformedEnv
from rlcollect.transforms.step_limit import StepLimit
from tests.transforms.transform_parity import (
    BATCHED_CARTPOLE_ACTIONS,
    CARTPOLE_ACTIONS,
    SEED,
    assert_same_entries,
    counting_actions,
    run_steps,
)

# 1: every step truncates; 2: the counting env's shortest episode ends at the limit
# (terminated and truncated together); 3, 4: the longer episodes are cut; 12: every counting
# episode, and most CartPole ones, terminate before the limit.
MAX_STEPS = [1, 2, 3, 4, 12]
# The collector's batch length in `run_like_a_collector`: prime to every limit above, so that
# counts and truncations cross the batch ends.
BATCH_STEPS = 7
FLAGS = [DONE, TERMINATED, TRUNCATED]
ENTRIES = [
    STEP_COUNT,
    OBSERVATION,
    *FLAGS,
    (NEXT, STEP_COUNT),
    (NEXT, OBSERVATION),
    (NEXT, REWARD),
    *[(NEXT, flag) for flag in FLAGS],
]


class CountingEnvWithoutTruncated(TensorDictCountingEnv):
    """The counting env without a truncated flag: both faces add it, as TorchRL's does."""

    def __init__(self) -> None:
        super().__init__(episode_length=(2, 3, 5), batch_size=(3,))
        flags = {name: self.done_spec[name] for name in (DONE, TERMINATED)}
        self.done_spec = Composite(flags, shape=self.batch_size)

    def _reset(self, tensordict: TensorDictBase | None) -> TensorDictBase:
        return super()._reset(tensordict).exclude(TRUNCATED)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        return super()._step(tensordict).exclude(TRUNCATED)


ENVS: dict[str, tuple[Callable[[], EnvBase], list[torch.Tensor]]] = {
    "counting": (
        lambda: CountingEnv(episode_length=(2, 3, 5), batch_size=(3,)),
        counting_actions(24),
    ),
    "counting-tensordict-first": (
        lambda: TensorDictCountingEnv(episode_length=(2, 3, 5), batch_size=(3,)),
        counting_actions(24),
    ),
    "counting-without-truncated": (CountingEnvWithoutTruncated, counting_actions(24)),
    "cartpole": (lambda: GymEnv("CartPole-v1"), CARTPOLE_ACTIONS),
    "cartpole-serial": (lambda: SerialEnv(3, "CartPole-v1"), BATCHED_CARTPOLE_ACTIONS),
    "cartpole-vector": (lambda: GymVectorEnv("CartPole-v1", 3), BATCHED_CARTPOLE_ACTIONS),
}


def run_like_a_collector(env: EnvBase, actions: Sequence[torch.Tensor]) -> TensorDictBase:
    """The buffer face as a collector drives it: reset into slot L of a `[*B, L + 1]` carrier,
    then per batch carry root L over to root 0 and `step_and_advance_into(t)` for t < L.
    Returns the steps stacked on the time dim, as `run_steps` does."""
    env.set_seed(SEED)
    carrier = allocate_carrier(env.full_spec, BATCH_STEPS)
    time_dim = len(env.batch_size)
    env.bind(carrier)
    env.reset_into(BATCH_STEPS)
    carried = [*env.observation_keys, *env.done_keys]
    steps = []
    for start in range(0, len(actions), BATCH_STEPS):
        for key in carried:
            tensor = carrier.get(key)
            tensor.select(time_dim, 0).copy_(tensor.select(time_dim, BATCH_STEPS))
        for t, action in enumerate(actions[start : start + BATCH_STEPS]):
            carrier.get(ACTION).select(time_dim, t).copy_(action)
            env.step_and_advance_into(t)
            steps.append(carrier[(Ellipsis, t)].clone())
    return torch.stack(steps, dim=time_dim)


FACES: dict[str, Callable[[Callable[[], EnvBase], int, list[torch.Tensor]], TensorDictBase]] = {
    "StepLimit-buffer": lambda make, limit, actions: run_like_a_collector(
        StepLimit(make(), limit), actions
    ),
    "StepLimit-tensordict": lambda make, limit, actions: run_steps(
        StepLimit(make(), limit), actions
    ),
    "StepCounter-buffer": lambda make, limit, actions: run_like_a_collector(
        TransformedEnv(make(), StepCounter(limit)), actions
    ),
}


@functools.cache
def reference(env_name: str, max_steps: int) -> TensorDictBase:
    """`StepCounter` through the TensorDict face."""
    make_env, actions = ENVS[env_name]
    return run_steps(TransformedEnv(make_env(), StepCounter(max_steps)), actions)


def assert_follows_the_rule(steps: TensorDictBase, max_steps: int) -> None:
    """TorchRL's rule, written out: the root count is 0 after a reset and the count under
    `"next"` is one more; the step whose count reaches `max_steps` is truncated and done; a done
    sub-env resets, so the next root counts from 0. None of these envs truncates by itself."""
    count, next_count = steps.get(STEP_COUNT), steps.get((NEXT, STEP_COUNT))
    done, terminated, truncated = (steps.get((NEXT, flag)) for flag in FLAGS)
    assert torch.equal(next_count, count + 1)
    assert not count[..., 0, :].any()
    assert torch.equal(truncated, next_count >= max_steps)
    assert torch.equal(done, terminated | truncated)
    restarted = next_count[..., :-1, :].masked_fill(done[..., :-1, :], 0)
    assert torch.equal(count[..., 1:, :], restarted)
    for flag in FLAGS:
        assert not steps.get(flag).any(), flag


@pytest.mark.parametrize("max_steps", MAX_STEPS)
@pytest.mark.parametrize("env_name", ENVS.keys())
@pytest.mark.parametrize("face", FACES.keys())
def test_step_limit_and_step_counter_agree_step_by_step(
    face: str, env_name: str, max_steps: int
) -> None:
    expected = reference(env_name, max_steps)
    assert_follows_the_rule(expected, max_steps)
    make_env, actions = ENVS[env_name]
    assert_same_entries(FACES[face](make_env, max_steps, actions), expected, ENTRIES)


@pytest.mark.parametrize("env_name", ENVS.keys())
def test_the_runs_end_episodes_both_ways(env_name: str) -> None:
    """Every env has, across the limits, episodes cut by the limit and episodes that end
    before it, so the comparison above covers both."""
    cut = ended = 0
    for max_steps in MAX_STEPS:
        steps = reference(env_name, max_steps)
        terminated, truncated = steps.get((NEXT, TERMINATED)), steps.get((NEXT, TRUNCATED))
        cut += int((truncated & ~terminated).sum())
        ended += int((terminated & ~truncated).sum())
    assert cut > 0
    assert ended > 0
    assert bool(reference(env_name, 1).get((NEXT, TRUNCATED)).all())

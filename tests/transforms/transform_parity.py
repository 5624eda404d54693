"""Shared helpers of the env transform tests: fixed-action runs and comparisons with TorchRL."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rlcollect.envs import EnvBase, allocate_carrier
from rlcollect.keys import ACTION, DONE, NEXT
from rlcollect.testing import CountingEnv, TensorDictCountingEnv

SEED = 3

# CartPole episodes last ~10 steps when pushed one way: 40 steps cross several episode ends.
CARTPOLE_ACTIONS = [torch.tensor([0, 1]) if t % 7 else torch.tensor([1, 0]) for t in range(40)]
# Three sub-envs pushed with different patterns, so their episodes end at different steps.
BATCHED_CARTPOLE_ACTIONS = [
    torch.stack(
        [
            torch.tensor([0, 1]) if (t + shift) % (5 + shift) else torch.tensor([1, 0])
            for shift in range(3)
        ]
    )
    for t in range(40)
]
PENDULUM_ACTIONS = [torch.tensor([0.5 * ((t % 5) - 2)]) for t in range(30)]

# Both kinds of counting env (buffer-first and TensorDict-first), with staggered episode ends.
COUNTING_ENVS = {
    "buffer-first": lambda: CountingEnv(episode_length=(2, 3, 5), batch_size=(3,)),
    "tensordict-first": lambda: TensorDictCountingEnv(episode_length=(2, 3, 5), batch_size=(3,)),
}


def counting_actions(steps: int, size: int = 3) -> list[torch.Tensor]:
    """Actions for the counting envs (ignored by them, but they must fit the spec)."""
    return [torch.zeros(size, dtype=torch.int64) for _ in range(steps)]


def run_steps(env: object, actions: Sequence[torch.Tensor], seed: int = SEED) -> TensorDictBase:
    """Seed, reset, then `step_and_maybe_reset` with each action; the steps stacked on time.

    Works for rlcollect and TorchRL envs alike (both speak the same TensorDict face).
    """
    env.set_seed(seed)  # type: ignore[attr-defined]
    root = env.reset()  # type: ignore[attr-defined]
    steps = []
    for action in actions:
        root.set(ACTION, action)
        step, root = env.step_and_maybe_reset(root)  # type: ignore[attr-defined]
        steps.append(step.clone())
    return torch.stack(steps, dim=len(env.batch_size))  # type: ignore[attr-defined]


def run_carrier(env: EnvBase, actions: Sequence[torch.Tensor], seed: int = SEED) -> TensorDict:
    """The same run through the buffer face: bind, `reset_into(0)`, `step_and_advance_into(t)`."""
    env.set_seed(seed)
    carrier = allocate_carrier(env.full_spec, len(actions))
    env.bind(carrier)
    env.reset_into(0)
    time_dim = len(env.batch_size)
    for t, action in enumerate(actions):
        carrier.get(ACTION).select(time_dim, t).copy_(action)
        env.step_and_advance_into(t)
    return carrier


def assert_same_entries(
    ours: TensorDictBase, theirs: TensorDictBase, entries: Sequence[object]
) -> None:
    """Same shapes, dtypes and values (floats to 1e-6) for every key of `entries`."""
    for key in entries:
        mine, reference = ours.get(key), theirs.get(key)
        assert mine.shape == reference.shape, (key, mine.shape, reference.shape)
        assert mine.dtype == reference.dtype, (key, mine.dtype, reference.dtype)
        if mine.dtype.is_floating_point:
            torch.testing.assert_close(mine, reference, rtol=1e-6, atol=1e-6, msg=str(key))
        else:
            assert torch.equal(mine, reference), key


def assert_faces_agree(env: EnvBase, actions: Sequence[torch.Tensor]) -> None:
    """The buffer face writes, step by step, what the TensorDict face returns."""
    steps = run_steps(env, actions)
    carrier = run_carrier(env, actions)
    written = carrier[(Ellipsis, slice(0, len(actions)))]
    assert_same_entries(written, steps, list(steps.keys(True, True)))


def assert_rows_match_single_envs(
    ours: TensorDictBase,
    make_reference: Callable[[], object],
    actions: Sequence[torch.Tensor],
    entries: Sequence[object],
) -> None:
    """Row i of a batched run equals a single reference env seeded `SEED + i` (sub-env i's seed
    under the `set_seed` contract) stepped with the actions of column i."""
    for row in range(ours.shape[0]):
        column = [action[row] for action in actions]
        reference = run_steps(make_reference(), column, seed=SEED + row)
        assert_same_entries(ours[row], reference, entries)


def episode_ends(steps: TensorDictBase) -> int:
    """How many episodes ended in `steps`."""
    return int(steps.get((NEXT, DONE)).sum())


def float64_pendulum() -> gym.Env:
    """Pendulum with float64 observations and a float64 action space."""
    env = gym.make("Pendulum-v1")
    low, high = env.observation_space.low, env.observation_space.high
    space = gym.spaces.Box(low.astype(np.float64), high.astype(np.float64), dtype=np.float64)
    env = gym.wrappers.TransformObservation(env, lambda obs: obs.astype(np.float64), space)
    action_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float64)
    return gym.wrappers.TransformAction(env, lambda action: action.astype(np.float32), action_space)

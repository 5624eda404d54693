"""`GymBatch`: the Gymnasium envs of a `SerialEnv`'s `GymEnv`s stepped in one call.

`SerialEnv` steps its sub-envs one after the other, and each `GymEnv` writes its own rows: at
hundreds of envs the per-env Python work (reading one action, a few scalar stores, a call per
sub-env) costs as much as the env itself. When every sub-env is a plain `GymEnv`, this face
reads all actions with one NumPy call, calls `env.step` in a tight loop, and stores the
observations, rewards and flags of the whole batch with one NumPy store per key. Only the
sub-envs that ended are visited again, to reset. What the carrier holds afterwards is what the
sub-envs' own buffer faces would have written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from tensordict import TensorDictBase

from rlcollect.envs.base import EnvBase
from rlcollect.envs.gym import GymEnv
from rlcollect.envs.gym_spaces import index_start
from rlcollect.envs.numpy_rows import NumpyRows, bind_numpy_rows
from rlcollect.envs.specs import OneHot, TensorSpec

# Below this, the batch's dozen NumPy calls per step cost more than the per-env scalar stores
# they replace (CartPole: about even at 8 envs, 1.2x faster at 16 and 32, 0.6x at 1 to 4).
MIN_ENVS = 16


def batched_actions(spec: TensorSpec, space: gym.Space) -> Callable[[np.ndarray], Any] | None:
    """A function turning the `[N, *action]` action rows at one step into a sequence of N
    actions `space` accepts, or None for the spaces `GymEnv` reads one row at a time.

    Discrete actions are given as NumPy integers: Gymnasium's `Discrete.contains` checks them
    faster than Python ints (no `np.iinfo` per call).
    """
    start = index_start(space)
    offset = 0 if start is None else start
    if isinstance(spec, OneHot):
        return lambda rows: list(rows.argmax(-1) + offset)
    if isinstance(space, gym.spaces.Discrete):
        return lambda rows: list(rows + offset)
    if isinstance(space, gym.spaces.Box):
        return lambda rows: list(rows.astype(space.dtype, copy=True))
    return None


class GymBatch:
    """Steps the Gymnasium envs under `envs` (plain `GymEnv`s with one observation array) and
    writes the batch's results into the carrier of the `SerialEnv` that holds them.

    Build it with `GymBatch.of(envs)`, which answers None when some sub-env needs its own
    buffer face (another env type, a dict or one-hot observation, an action space read row by
    row) or when there are fewer than `MIN_ENVS` of them.
    """

    _rows: NumpyRows  # the carrier's NumPy views `[N, L + 1, ...]`, set by `bind`

    def __init__(self, envs: Sequence[GymEnv], read_actions: Callable[[np.ndarray], Any]) -> None:
        self._paths = envs[0].observation_value_paths
        self._envs = [env.gym_env for env in envs]
        self._steps = [env.step for env in self._envs]
        self._read_actions = read_actions

    @classmethod
    def of(cls, envs: Sequence[EnvBase]) -> GymBatch | None:
        """The batched face of `envs`, or None when one of them needs its own."""
        if len(envs) < MIN_ENVS:
            return None
        if not all(type(env) is GymEnv and env.writes_plain_observation for env in envs):
            return None
        first: GymEnv = envs[0]  # type: ignore[assignment]
        read_actions = batched_actions(first.action_spec, first.gym_env.action_space)
        if read_actions is None:
            return None
        return cls(envs, read_actions)  # type: ignore[arg-type]

    def bind(self, carrier: TensorDictBase) -> None:
        """Write into `carrier` (batch `[N, L + 1]`)."""
        self._rows = bind_numpy_rows(carrier, self._paths, "SerialEnv")

    def step_and_advance_into(self, t: int) -> None:
        """Step every env with its action at `t`; write `"next"` at `t` and the root at
        `t + 1`, resetting the envs that ended (as `GymEnv.step_and_advance_into` does)."""
        rows = self._rows
        actions = self._read_actions(rows.action[:, t])
        results = [step(action) for step, action in zip(self._steps, actions, strict=True)]
        observations, rewards, terminated, truncated, _ = zip(*results, strict=True)
        next_observation = rows.next_observations[0]
        next_observation[:, t] = observations
        rows.reward[:, t, 0] = rewards
        done_rows, terminated_rows, truncated_rows = rows.next_flags
        terminated_rows[:, t, 0] = terminated
        truncated_rows[:, t, 0] = truncated
        done = terminated_rows[:, t, 0] | truncated_rows[:, t, 0]
        done_rows[:, t, 0] = done
        root_observation = rows.root_observations[0]
        root_observation[:, t + 1] = next_observation[:, t]
        if done.any():
            self._reset_ended(np.flatnonzero(done), t + 1)

    def _reset_ended(self, ended: np.ndarray, t: int) -> None:
        rows = self._rows
        root_observation = rows.root_observations[0]
        for index in ended.tolist():
            root_observation[index, t] = self._envs[index].reset()[0]
        for flag in rows.root_flags:
            flag[ended, t] = False

"""`GymVectorEnv`: a Gymnasium vector env as a batched env, writing through NumPy views."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.envs.base import EnvBase
from rlcollect.envs.gym_spaces import (
    ValuePath,
    index_start,
    observation_paths,
    observation_spec_from_space,
    spec_from_space,
    write_value,
)
from rlcollect.envs.numpy_rows import NumpyRows, bind_numpy_rows
from rlcollect.envs.specs import Categorical, Composite, OneHot, TensorSpec, Unbounded
from rlcollect.envs.step_record import RESET, STEP, StepRecord


def make_vector_env(
    env_id: str,
    num_envs: int | None,
    vectorization_mode: str,
    autoreset_mode: AutoresetMode = AutoresetMode.SAME_STEP,
    **make_kwargs: Any,
) -> gym.vector.VectorEnv:
    """`gymnasium.make_vec` in `autoreset_mode`, with errors that name the argument."""
    if (
        num_envs is None
        or isinstance(num_envs, bool)
        or not isinstance(num_envs, numbers.Integral)
        or num_envs < 1
    ):
        raise ValueError(
            f"num_envs must be a positive int when vector_env_or_id is an id; got "
            f"num_envs={num_envs!r}. Pass e.g. GymVectorEnv({env_id!r}, num_envs=8)."
        )
    try:
        return gym.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode=vectorization_mode,
            vector_kwargs={"autoreset_mode": autoreset_mode},
            **make_kwargs,
        )
    except gym.error.Error as err:
        raise ValueError(
            f"vector_env_or_id={env_id!r} is not a registered Gymnasium id ({err}); check the "
            "spelling and version suffix (e.g. 'CartPole-v1')."
        ) from err


def autoreset_mode_of(vector_env: gym.vector.VectorEnv) -> AutoresetMode:
    """The vector env's autoreset mode (Gymnasium's default, `NEXT_STEP`, when it names none)."""
    return AutoresetMode(vector_env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))


def parse_autoreset_mode(value: AutoresetMode | str) -> AutoresetMode:
    """`value` as an `AutoresetMode` (its value, e.g. "NextStep", or its name, "NEXT_STEP")."""
    if isinstance(value, AutoresetMode):
        return value
    for mode in AutoresetMode:
        if value in (mode.value, mode.name):
            return mode
    accepted = ", ".join(repr(mode.value) for mode in AutoresetMode)
    raise ValueError(f"autoreset_mode={value!r} is not an AutoresetMode; use one of {accepted}.")


def batched_action_reader(spec: TensorSpec, space: gym.Space) -> Callable[[np.ndarray], Any]:
    """A function turning the `[N, *action]` rows of the carrier into a batched Gymnasium action
    (indices are stored from 0, so a Discrete / MultiDiscrete `start` is added back)."""
    start = index_start(space)
    if isinstance(spec, OneHot):
        if start is None:
            return lambda rows: rows.argmax(-1)
        return lambda rows: rows.argmax(-1) + start
    if isinstance(space, gym.spaces.Box):
        return lambda rows: rows.astype(space.dtype, copy=False)
    if start is None:
        return lambda rows: rows
    return lambda rows: rows + start


def write_batch(rows: np.ndarray, t: int, value: np.ndarray, path: ValuePath) -> None:
    """Write one batched Gymnasium value into `rows[:, t]` (rows: `[N, L + 1, *feature]`)."""
    if path.one_hot:
        rows[:, t] = 0
        rows[np.arange(len(rows)), t, value] = 1
    else:
        rows[:, t] = value


def write_batch_masked(
    rows: np.ndarray, t: int, value: np.ndarray, path: ValuePath, mask: np.ndarray
) -> None:
    """Write `value` into `rows[:, t]` for the sub-envs selected by the bool `mask` only."""
    if path.one_hot:
        rows[mask, t] = 0
        rows[np.flatnonzero(mask), t, value[mask]] = 1
    else:
        rows[mask, t] = value[mask]


def vector_env_from(
    vector_env_or_id: str | gym.vector.VectorEnv,
    num_envs: int | None,
    vectorization_mode: str,
    autoreset_mode: AutoresetMode | str,
    make_kwargs: dict[str, Any],
) -> gym.vector.VectorEnv:
    """The vector env to wrap: `vector_env_or_id` itself, checked, or one made from an id."""
    if isinstance(vector_env_or_id, str):
        mode = parse_autoreset_mode(autoreset_mode)
        return make_vector_env(vector_env_or_id, num_envs, vectorization_mode, mode, **make_kwargs)
    if not isinstance(vector_env_or_id, gym.vector.VectorEnv):
        raise TypeError(
            f"vector_env_or_id must be a gymnasium.vector.VectorEnv or a Gymnasium id; got "
            f"{type(vector_env_or_id).__name__}. Wrap a single gymnasium.Env with GymEnv."
        )
    if num_envs is not None and num_envs != vector_env_or_id.num_envs:
        raise ValueError(
            f"num_envs={num_envs} but the vector env has {vector_env_or_id.num_envs} "
            "sub-envs; leave num_envs=None with a vector env instance."
        )
    return vector_env_or_id


class GymVectorEnv(EnvBase):
    """A Gymnasium vector env (`SyncVectorEnv`, `AsyncVectorEnv`, ...) as an env of batch
    `[num_envs]`, with the keys and specs of `GymEnv`.

    Buffer-first: one `step` of the vector env per time step, its batched results written into
    NumPy views of the carrier. Every autoreset mode works:

    * `SAME_STEP`: the terminal observation comes in `info["final_obs"]` and goes to `"next"`,
      the reset observation to the root of the next step;
    * `NEXT_STEP` (Gymnasium's default): the step after a sub-env's last one would only reset
      it, ignoring the action. That step is never taken: the done sub-envs are reset at once
      with a reset mask (which also clears the vector env's pending autoreset), so every step
      of a batch is a transition and trajectories and returns run on unbroken;
    * `DISABLED`: the done sub-envs are reset with a reset mask.

    Args:
        vector_env_or_id: a `gymnasium.vector.VectorEnv`, or a Gymnasium id made with
            `gymnasium.make_vec(id, num_envs, vectorization_mode, autoreset_mode)`.
        num_envs: the number of sub-envs (required with an id; checked with an instance).

    Keyword Args:
        vectorization_mode: "sync" or "async", when `vector_env_or_id` is an id.
        autoreset_mode: the autoreset mode of a vector env made from an id ("SameStep",
            "NextStep" or "Disabled", or an `AutoresetMode`); an instance keeps its own.
        categorical_action_encoding: integer actions instead of one-hot for `Discrete`.
        record_steps: keep every step's Gymnasium infos and timing per carrier slot in
            `step_record` (a `StepRecord`), for a collector that hands them on (RLlib's door).
        **make_kwargs: passed to `gymnasium.make_vec` with an id.

    Examples:
        >>> env = GymVectorEnv("CartPole-v1", num_envs=4)
        >>> env.set_seed(0)
        4
        >>> data = env.rollout(3, break_when_any_done=False)
        >>> data["next", "observation"].shape
        torch.Size([4, 3, 4])
        >>> env.close()
    """

    _rows: NumpyRows  # the carrier's NumPy views, set by `_bind`

    def __init__(
        self,
        vector_env_or_id: str | gym.vector.VectorEnv,
        num_envs: int | None = None,
        *,
        vectorization_mode: Literal["sync", "async"] = "sync",
        autoreset_mode: AutoresetMode | str = AutoresetMode.SAME_STEP,
        categorical_action_encoding: bool = False,
        record_steps: bool = False,
        **make_kwargs: Any,
    ) -> None:
        vector_env = vector_env_from(
            vector_env_or_id, num_envs, vectorization_mode, autoreset_mode, make_kwargs
        )
        self._mode = autoreset_mode_of(vector_env)
        self._env = vector_env
        self.num_envs = vector_env.num_envs
        super().__init__(batch_size=(self.num_envs,), device="cpu")
        single_space = vector_env.single_action_space
        if isinstance(single_space, (gym.spaces.Dict, gym.spaces.Tuple)):
            raise TypeError(
                f"action space {single_space!r} is not supported: actions must be one tensor; "
                "flatten the action space with a Gymnasium wrapper."
            )
        single_observation = observation_spec_from_space(
            vector_env.single_observation_space, categorical_action_encoding
        )
        single_action = spec_from_space(single_space, categorical_action_encoding)
        self.observation_spec = single_observation.expand(self.num_envs)
        self.action_spec = single_action.expand(self.num_envs)
        self.reward_spec = Unbounded(shape=(self.num_envs, 1), dtype=torch.float32)
        flag = Categorical(2, shape=(1,), dtype=torch.bool)
        self.done_spec = Composite(dict.fromkeys(keys.DONE_KEYS, flag)).expand(self.num_envs)
        is_dict_space = isinstance(vector_env.single_observation_space, gym.spaces.Dict)
        self._paths = observation_paths(
            single_observation, is_dict_space, vector_env.single_observation_space
        )
        self._read_actions = batched_action_reader(single_action, single_space)
        self._no_autoreset = np.zeros(self.num_envs, dtype=np.bool_)
        self._autoreset = self._no_autoreset
        self._last_observation: Any = None
        self._last_info: Any = {}
        self._last_done = self._no_autoreset
        self.step_record = StepRecord(self.num_envs) if record_steps else None
        self._next_seed: int | None = None

    @property
    def vector_env(self) -> gym.vector.VectorEnv:
        """The wrapped Gymnasium vector env."""
        return self._env

    # --- buffer face --------------------------------------------------------------------------

    def _bind(self, carrier: TensorDictBase) -> None:
        self._rows = bind_numpy_rows(carrier, self._paths, type(self).__name__)
        if self.step_record is not None:
            self.step_record.bind(carrier.shape[-1])

    def reset_into(self, t: int, mask: torch.Tensor | None = None) -> None:
        self._check_open()
        selected = np.ones(self.num_envs, dtype=np.bool_)
        if mask is not None:
            selected = mask.reshape(self.num_envs).numpy(force=True).astype(np.bool_)
        # The sub-envs the vector env reset at the end of the last step (SAME_STEP) are not reset
        # again: their reset observation is used, so that each episode costs one env.reset(),
        # as with GymEnv, whichever face drives the env.
        autoreset = selected & self._autoreset
        fresh = selected & ~autoreset
        self._reset_fresh(t, fresh, masked=mask is not None)
        if autoreset.any():
            self._write_observation_masked(t, self._last_observation, autoreset)
            if self.step_record is not None:
                self.step_record.record_reset(t, self._last_info, autoreset, self._last_observation)
        for flag in self._rows.root_flags:
            flag[selected, t] = False
        self._autoreset = self._autoreset & ~selected

    def _reset_fresh(self, t: int, fresh: np.ndarray, masked: bool) -> None:
        """Reset the `fresh` sub-envs (all: one plain, maybe seeded, reset) into root `t`;
        `masked`: a reset of the sub-envs a mask chose (those that ended), not a full one."""
        record = self.step_record
        if not fresh.any():
            return
        if record is not None:
            record.begin(RESET, masked=masked)
        if fresh.all():
            seed, self._next_seed = self._next_seed, None
            observation, info = self._env.reset(seed=seed)
            self._write_observation(self._rows.root_observations, t, observation)
        else:
            observation, info = self._env.reset(options={"reset_mask": fresh.copy()})
            self._write_observation_masked(t, observation, fresh)
        if record is not None:
            record.record_reset(t, info, None if fresh.all() else fresh, observation)

    def step_into(self, t: int) -> None:
        self._step_rows(t)

    def advance_into(self, t: int) -> None:
        rows = self._rows
        self._write_observation(rows.root_observations, t + 1, self._last_observation)
        # The carrier's flags, not the env's: a wrapper (e.g. a step limit) may have set them.
        # The sub-envs the vector env reset itself already have their reset observation.
        unreset = rows.next_flags[0][:, t, 0] & ~self._autoreset
        self._autoreset = self._no_autoreset
        if unreset.any():
            self.reset_into(t + 1, torch.from_numpy(unreset))

    def step_and_advance_into(self, t: int) -> None:
        observation = self._step_rows(t)
        self._write_observation(self._rows.root_observations, t + 1, observation)
        self._autoreset = self._no_autoreset
        # NEXT_STEP and DISABLED: the vector env has not reset the done sub-envs; reset them now.
        if self._mode is not AutoresetMode.SAME_STEP and self._last_done.any():
            self.reset_into(t + 1, torch.from_numpy(self._last_done))

    def _step_rows(self, t: int) -> Any:
        """Step the vector env with the actions at `t` and write `"next"` at `t`."""
        self._check_open()
        rows = self._rows
        actions = self._read_actions(rows.action[:, t])
        record = self.step_record
        if record is None:
            observation, reward, terminated, truncated, info = self._env.step(actions)
        else:
            started = record.begin(STEP)
            observation, reward, terminated, truncated, info = self._env.step(actions)
            record.record_step(t, info, started, observation)
        self._write_observation(rows.next_observations, t, observation)
        rows.reward[:, t, 0] = reward
        done = terminated | truncated
        done_rows, terminated_rows, truncated_rows = rows.next_flags
        done_rows[:, t, 0] = done
        terminated_rows[:, t, 0] = terminated
        truncated_rows[:, t, 0] = truncated
        self._last_observation, self._last_info = observation, info
        self._last_done = done
        self._autoreset = self._no_autoreset
        if self._mode is AutoresetMode.SAME_STEP:
            self._autoreset = done
            if "final_obs" in info:
                self._write_final_observations(t, info["final_obs"], info["_final_obs"])
        return observation

    def _write_final_observations(self, t: int, final: np.ndarray, present: np.ndarray) -> None:
        """`"next"` at a done step holds the terminal observation, not the reset one."""
        for index in np.flatnonzero(present):
            for path, rows in zip(self._paths, self._rows.next_observations, strict=True):
                write_value(rows[index], t, path.extract(final[index]), path.one_hot)

    def _write_observation(self, rows_list: list[np.ndarray], t: int, observation: Any) -> None:
        for path, rows in zip(self._paths, rows_list, strict=True):
            write_batch(rows, t, path.extract(observation), path)

    def _write_observation_masked(self, t: int, observation: Any, mask: np.ndarray) -> None:
        for path, rows in zip(self._paths, self._rows.root_observations, strict=True):
            write_batch_masked(rows, t, path.extract(observation), path, mask)

    # --- protocol -----------------------------------------------------------------------------

    def seed_next_reset(self, seed: int | None) -> None:
        """The next reset of every sub-env is Gymnasium's `reset(seed=seed)` (sub-env `i` gets
        `seed + i`): a seeded start without a reset of its own, as RLlib's runners seed theirs."""
        self._next_seed = seed

    def _set_seed(self, seed: int) -> int:
        self._env.reset(seed=seed)
        self._env.action_space.seed(seed)
        self._autoreset = self._no_autoreset
        return seed + self.num_envs

    def close(self) -> None:
        if not self.is_closed:
            self._env.close()
        super().close()

    def __repr__(self) -> str:
        return f"GymVectorEnv(num_envs={self.num_envs}, vector_env={type(self._env).__name__})"

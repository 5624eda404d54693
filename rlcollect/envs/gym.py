"""`GymEnv`: a Gymnasium env behind the rlcollect env protocol, writing through NumPy views."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.envs.base import EnvBase
from rlcollect.envs.gym_spaces import (
    ValuePath,
    action_reader,
    observation_paths,
    observation_spec_from_space,
    spec_from_space,
    write_value,
)
from rlcollect.envs.numpy_rows import NumpyRows, bind_numpy_rows
from rlcollect.envs.specs import Categorical, Composite, Unbounded


def make_gym_env(env_id: str, argument: str = "env", **make_kwargs: Any) -> gym.Env:
    """`gymnasium.make(env_id)` with an error that names `argument` when the id is unknown."""
    if not isinstance(env_id, str):
        raise TypeError(f"{argument} must be a Gymnasium id string; got {type(env_id).__name__}.")
    try:
        return gym.make(env_id, **make_kwargs)
    except gym.error.Error as err:
        raise ValueError(
            f"{argument}={env_id!r} is not a registered Gymnasium env ({err}); check the spelling "
            "and version suffix (e.g. 'CartPole-v1'), or import the package that registers it."
        ) from err


def flat_cells(rows: np.ndarray) -> Any:
    """A flat memoryview over `[L + 1, 1]` scalar rows: storing one Python scalar through it
    costs ~5x less than NumPy item assignment (the rows themselves when not C-contiguous)."""
    if rows.ndim == 2 and rows.shape[1] == 1 and rows.flags.c_contiguous:
        view: Any = memoryview(rows)  # type: ignore[arg-type]
        return view.cast("B").cast(rows.dtype.char)
    return rows


class GymEnv(EnvBase):
    """A Gymnasium env with TorchRL's keys: `"observation"` (or one key per dict entry),
    one-hot `"action"` for `Discrete` (categorical with `categorical_action_encoding=True`),
    `("next", "reward")` `[1]` float32 and `done` / `terminated` / `truncated` `[1]` bool.

    Its buffer face writes each step straight into NumPy views of the carrier, so stepping
    costs one `env.step` and a few array stores.

    Args:
        env: a Gymnasium id (made with `gymnasium.make(env, **make_kwargs)`) or an env instance.
        categorical_action_encoding: integer actions instead of one-hot for `Discrete`.

    Examples:
        >>> env = GymEnv("CartPole-v1")
        >>> _ = env.set_seed(0)
        >>> data = env.rollout(5)
        >>> data.batch_size, data.names
        (torch.Size([5]), ['time'])
        >>> data["next", "observation"].shape
        torch.Size([5, 4])
        >>> env.close()
    """

    _rows: NumpyRows  # the carrier's NumPy views, set by `_bind`

    def __init__(
        self,
        env: str | gym.Env,
        categorical_action_encoding: bool = False,
        **make_kwargs: Any,
    ) -> None:
        super().__init__(batch_size=(), device="cpu")
        if isinstance(env, str):
            env = make_gym_env(env, **make_kwargs)
        elif isinstance(env, gym.vector.VectorEnv):
            raise TypeError("env is a Gymnasium vector env; wrap it with GymVectorEnv instead.")
        elif not isinstance(env, gym.Env):
            raise TypeError(
                f"env must be a Gymnasium id or a gymnasium.Env; got {type(env).__name__}."
            )
        self._env = env
        self.categorical_action_encoding = categorical_action_encoding
        if isinstance(env.action_space, (gym.spaces.Dict, gym.spaces.Tuple)):
            raise TypeError(
                f"action space {env.action_space!r} is not supported: actions must be one "
                "tensor; flatten the action space with a Gymnasium wrapper."
            )
        self.observation_spec = observation_spec_from_space(
            env.observation_space, categorical_action_encoding
        )
        self.action_spec = spec_from_space(env.action_space, categorical_action_encoding)
        self.reward_spec = Unbounded(shape=(1,), dtype=torch.float32)
        flag = Categorical(2, shape=(1,), dtype=torch.bool)
        self.done_spec = Composite(dict.fromkeys(keys.DONE_KEYS, flag))
        is_dict_space = isinstance(env.observation_space, gym.spaces.Dict)
        self._paths = observation_paths(self.observation_spec, is_dict_space, env.observation_space)
        self._read_action = action_reader(self.action_spec, env.action_space)
        self._last_observation: Any = None
        # One plain observation (e.g. a Box) is stored in one assignment, without the path walk.
        paths = self._paths
        self._is_plain_observation = len(paths) == 1 and not (
            paths[0].path or paths[0].one_hot or paths[0].start is not None
        )

    @property
    def gym_env(self) -> gym.Env:
        """The wrapped Gymnasium env."""
        return self._env

    @property
    def writes_plain_observation(self) -> bool:
        """Whether the observation is one array stored as it comes (a `Box`, not a dict of
        entries or a one-hot index): what `SerialEnv`'s batched face (`GymBatch`) writes."""
        return self._is_plain_observation

    @property
    def observation_value_paths(self) -> list[ValuePath]:
        """Where each observation key of the carrier is found in a Gymnasium observation."""
        return list(self._paths)

    # --- buffer face --------------------------------------------------------------------------

    def _bind(self, carrier: TensorDictBase) -> None:
        rows = self._rows = bind_numpy_rows(carrier, self._paths, type(self).__name__)
        self._next_done_rows = rows.next_flags[0][..., 0]
        self._reward_cells = flat_cells(rows.reward)
        self._next_flag_cells = [flat_cells(flag) for flag in rows.next_flags]

    def reset_into(self, t: int, mask: torch.Tensor | None = None) -> None:
        self._check_open()
        if mask is not None and not bool(mask):
            return
        observation, _ = self._env.reset()
        rows = self._rows
        self._write_observation(rows.root_observations, t, observation)
        for flag in rows.root_flags:
            flag[t] = False

    def step_into(self, t: int) -> None:
        self._check_open()
        rows = self._rows
        action = self._read_action(rows.action[t])
        observation, reward, terminated, truncated, _ = self._env.step(action)
        self._write_observation(rows.next_observations, t, observation)
        rows.reward[t] = reward
        done = terminated or truncated
        done_rows, terminated_rows, truncated_rows = rows.next_flags
        done_rows[t] = done
        terminated_rows[t] = terminated
        truncated_rows[t] = truncated
        self._last_observation = observation

    def advance_into(self, t: int) -> None:
        # The carrier's flag, not the env's: a wrapper (e.g. a step limit) may have set it.
        if self._next_done_rows[t]:
            self.reset_into(t + 1)
            return
        self._write_observation(self._rows.root_observations, t + 1, self._last_observation)

    def step_and_advance_into(self, t: int) -> None:
        """`step_into(t)` then `advance_into(t)` in one call: the collectors' hot path."""
        self._check_open()
        rows = self._rows
        action = self._read_action(rows.action[t])
        observation, reward, terminated, truncated, _ = self._env.step(action)
        self._write_observation(rows.next_observations, t, observation)
        self._reward_cells[t] = float(reward)
        done = bool(terminated or truncated)
        done_cells, terminated_cells, truncated_cells = self._next_flag_cells
        done_cells[t] = done
        terminated_cells[t] = bool(terminated)
        truncated_cells[t] = bool(truncated)
        if done:
            self.reset_into(t + 1)
        else:
            self._write_observation(rows.root_observations, t + 1, observation)

    def _write_observation(self, rows: list[np.ndarray], t: int, observation: Any) -> None:
        if self._is_plain_observation:
            rows[0][t] = observation
            return
        for path, destination in zip(self._paths, rows, strict=True):
            write_value(destination, t, path.extract(observation), path.one_hot)

    # --- protocol -----------------------------------------------------------------------------

    def _set_seed(self, seed: int) -> int:
        self._env.reset(seed=seed)
        self._env.action_space.seed(seed)
        return seed + 1

    def close(self) -> None:
        if not self.is_closed:
            self._env.close()
        super().close()

"""`EnvPoolEnv`: EnvPool's C++ thread pools as a batched env, writing straight into the carrier."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.envs.base import EnvBase
from rlcollect.envs.envpool_pools import (
    Pool,
    check_positive_int,
    make_pools,
    pool_size,
    quiet_spaces,
)
from rlcollect.envs.gym_spaces import ValuePath, observation_spec_from_space, spec_from_space
from rlcollect.envs.gym_vector import batched_action_reader
from rlcollect.envs.numpy_rows import NumpyRows, bind_numpy_rows
from rlcollect.envs.specs import Categorical, Composite, Unbounded


class EnvPoolEnv(EnvBase):
    """An EnvPool task (classic control, MuJoCo, Atari, ...) as an env of batch `[num_envs]`,
    with the keys and flags of TorchRL's `MultiThreadedEnv`: `"observation"`, `"action"`
    (integer indices for discrete actions), `("next", "reward")`, `"done"`, `"terminated"` and
    `"truncated"` (shaped `[num_envs, 1]`, as every rlcollect env).

    Buffer-first: each step sends the carrier's actions to EnvPool and writes what it returns
    (observations, rewards, flags) straight into NumPy views of the carrier, with no tensor or
    TensorDict built per step.

    EnvPool resets a finished env on the step after its last one (next-step autoreset), where
    the action is ignored and no transition happens. This env never takes that step: it resets
    the finished envs explicitly as soon as they end (EnvPool's `reset(env_ids)`, which draws
    the same start state), so every step of a batch is a real transition and the episode goes
    on exactly as in EnvPool's own loop.

    Modes:
        * synchronous (`batch_size=None`): one pool of `num_envs` envs; a step sends all the
          actions and receives all the results.
        * send / recv (`batch_size` divides `num_envs`): `num_envs // batch_size` pools of
          `batch_size` envs; a step sends every pool its actions before receiving any, then
          writes each pool's batch (with EnvPool's env ids, which say where each row goes) as
          it is received, so the pools still stepping overlap with the writes and with the
          resets of the pools already in. With many short episodes this is the faster mode:
          on CartPole at 256 envs, two pools of 128 with one thread each ran 5-10% faster
          than one pool with two threads (`benchmarks/scaling.py`, `ours-envpool-pools`).
          One pool whose batch is smaller than its envs (EnvPool's own async mode) cannot be
          used: its `recv` blocks until `batch_size` envs are ready, so finished envs could
          not be reset alone.

    Args:
        env_id: an EnvPool task id (`envpool.list_all_envs()`), e.g. "CartPole-v1", "Pong-v5"
            (84x84 grey frames stacked 4 deep, `[4, 84, 84]` uint8), "HalfCheetah-v4".
        num_envs: the number of envs.

    Keyword Args:
        batch_size: None (synchronous) or the size of each pool in send / recv mode.
        seed: the seed of env 0; env i gets `seed + i` (EnvPool seeds at construction, so
            `set_seed` rebuilds the pools).
        num_threads: EnvPool's worker threads per pool (None: EnvPool's default).
        categorical_action_encoding: integer actions for discrete spaces (TorchRL's
            `MultiThreadedEnv` always uses them); False gives one-hot actions.
        **make_kwargs: passed to `envpool.make` (e.g. `episodic_life=True`, `max_episode_steps`).

    Raises:
        ImportError: when `envpool` is not installed.
        ValueError: for an unknown id, a `num_envs` that is not a positive int, or a
            `batch_size` that does not divide it.

    Examples:
        >>> env = EnvPoolEnv("CartPole-v1", num_envs=4, seed=0)
        >>> data = env.rollout(3, break_when_any_done=False)
        >>> data["next", "observation"].shape, data["action"].dtype
        (torch.Size([4, 3, 4]), torch.int64)
        >>> env.close()
    """

    _rows: NumpyRows  # the carrier's NumPy views, set by `_bind`

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        *,
        batch_size: int | None = None,
        seed: int = 0,
        num_threads: int | None = None,
        categorical_action_encoding: bool = True,
        **make_kwargs: Any,
    ) -> None:
        if not isinstance(env_id, str):
            raise TypeError(f"env_id must be an EnvPool task id (a str); got {env_id!r}.")
        self.num_envs = check_positive_int(
            "num_envs", num_envs, f"Pass e.g. EnvPoolEnv({env_id!r}, num_envs=8)."
        )
        self.env_id = env_id
        self._pool_size = pool_size(self.num_envs, batch_size)
        self._num_threads = num_threads
        self._make_kwargs = make_kwargs
        self._pools: list[Pool] = make_pools(
            env_id, self.num_envs, self._pool_size, int(seed), num_threads, make_kwargs
        )
        # The seed of pools that have not been used yet: seeding them with it again is free.
        self._unused_seed: int | None = int(seed)
        super().__init__(batch_size=(self.num_envs,), device="cpu")
        with quiet_spaces():
            spec = self._pools[0].handle.spec
            observation_space, action_space = spec.observation_space, spec.action_space
        self._define_specs(observation_space, action_space, categorical_action_encoding)

    def _define_specs(
        self, observation_space: gym.Space, action_space: gym.Space, categorical: bool
    ) -> None:
        if not isinstance(observation_space, gym.spaces.Box):
            raise TypeError(
                f"{self.env_id} observes {observation_space!r}; EnvPoolEnv handles Box "
                "observations (classic control, MuJoCo, Atari)."
            )
        # One env's Gymnasium spaces, as a Gymnasium vector env names them (for a framework that
        # builds its model from spaces, e.g. RLlib's door).
        self.single_observation_space, self.single_action_space = observation_space, action_space
        single_observation = observation_spec_from_space(observation_space)
        single_action = spec_from_space(action_space, categorical)
        self.observation_spec = single_observation.expand(self.num_envs)
        self.action_spec = single_action.expand(self.num_envs)
        self.reward_spec = Unbounded(shape=(self.num_envs, 1), dtype=torch.float32)
        flag = Categorical(2, shape=(1,), dtype=torch.bool)
        self.done_spec = Composite(dict.fromkeys(keys.DONE_KEYS, flag)).expand(self.num_envs)
        self._read_actions = batched_action_reader(single_action, action_space)
        self._observation_key = keys.as_tuple_key(keys.OBSERVATION)

    @property
    def is_synchronous(self) -> bool:
        """Whether the envs run as one pool (False: send / recv over several pools)."""
        return len(self._pools) == 1

    # --- buffer face --------------------------------------------------------------------------

    def _bind(self, carrier: TensorDictBase) -> None:
        path = ValuePath(self._observation_key, (), one_hot=False)
        self._rows = bind_numpy_rows(carrier, [path], type(self).__name__)

    def reset_into(self, t: int, mask: torch.Tensor | None = None) -> None:
        self._check_open()
        selected = None
        if mask is not None:
            selected = mask.reshape(self.num_envs).numpy(force=True).astype(np.bool_)
        self._reset_rows(t, selected)

    def _reset_rows(self, t: int, selected: np.ndarray | None) -> None:
        """Reset the envs of `selected` (all when None) into the root at `t`, flags cleared;
        every pool's reset starts before the first is waited for."""
        resetting = []
        for pool in self._pools:
            local = None
            if selected is not None:
                local = np.flatnonzero(selected[pool.start : pool.start + pool.size])
                if not len(local):
                    continue
                local = local.astype(np.int32)
            pool.start_reset(local)
            resetting.append(pool)
        self._finish_resets(t, resetting)

    def _finish_resets(self, t: int, resetting: list[Pool]) -> None:
        """Wait for the resets started on `resetting` and write them into the root at `t`."""
        if resetting:
            self._unused_seed = None
        for pool in resetting:
            observation, env_ids = pool.finish_reset()
            at = pool.rows(env_ids)
            self._rows.root_observations[0][at, t] = observation
            for flag in self._rows.root_flags:
                flag[at, t] = False

    def step_into(self, t: int) -> None:
        self._check_open()
        self._step_rows(t, next_root=False)

    def advance_into(self, t: int) -> None:
        rows = self._rows
        rows.root_observations[0][:, t + 1] = rows.next_observations[0][:, t]
        # The carrier's flags, not EnvPool's: a transform (e.g. a step limit) may have set them.
        done = rows.next_flags[0][:, t, 0]
        if done.any():
            self._reset_rows(t + 1, done.copy())

    def step_and_advance_into(self, t: int) -> None:
        self._check_open()
        self._step_rows(t, next_root=True)

    def _step_rows(self, t: int, next_root: bool) -> None:
        """Send the actions at `t` and write each received batch into `"next"` at `t`. With
        `next_root`, also fill the root at `t + 1`, where each pool's finished envs are reset:
        their reset starts as soon as the pool's batch is in, and runs in EnvPool's threads
        while the batches are written (the other pools may still be stepping too)."""
        rows = self._rows
        actions = self._read_actions(rows.action[:, t])
        for pool in self._pools:
            pool.send(actions[pool.start : pool.start + pool.size], pool.local_ids)
        done_rows, terminated_rows, truncated_rows = rows.next_flags
        resetting = []
        for pool in self._pools:
            observation, reward, terminated, truncated, env_ids = pool.recv()
            done = terminated | truncated
            if next_root and done.any():
                pool.start_reset(env_ids[done])
                resetting.append(pool)
            at = pool.rows(env_ids)
            rows.next_observations[0][at, t] = observation
            if next_root:
                rows.root_observations[0][at, t + 1] = observation
            rows.reward[at, t, 0] = reward
            terminated_rows[at, t, 0] = terminated
            truncated_rows[at, t, 0] = truncated
            done_rows[at, t, 0] = done
        self._finish_resets(t + 1, resetting)

    # --- protocol -----------------------------------------------------------------------------

    def _set_seed(self, seed: int) -> int:
        if seed == self._unused_seed:
            return seed + self.num_envs
        # EnvPool takes its seed at construction only, so the pools are rebuilt.
        self._close_pools()
        self._pools = make_pools(
            self.env_id,
            self.num_envs,
            self._pool_size,
            seed,
            self._num_threads,
            self._make_kwargs,
        )
        self._unused_seed = seed
        return seed + self.num_envs

    def _close_pools(self) -> None:
        for pool in self._pools:
            pool.handle.close()

    def close(self) -> None:
        if not self.is_closed:
            self._close_pools()
        super().close()

    def __repr__(self) -> str:
        mode = "sync" if self.is_synchronous else f"send/recv, batch_size={self._pool_size}"
        return f"EnvPoolEnv({self.env_id!r}, num_envs={self.num_envs}, {mode})"

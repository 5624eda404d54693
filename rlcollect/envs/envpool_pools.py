"""EnvPool, imported lazily, and the pools an `EnvPoolEnv` steps: one for its synchronous mode,
several for its send / recv mode."""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np


def import_envpool() -> ModuleType:
    """The `envpool` module, or an ImportError that says how to install it (an optional extra)."""
    try:
        import envpool
    except ImportError as err:
        raise ImportError(
            "EnvPoolEnv needs the optional `envpool` package, which is not installed; install "
            "it with `pip install 'rlcollect[envpool]'` (or `pip install envpool`)."
        ) from err
    return envpool


def check_positive_int(name: str, value: object, example: str) -> int:
    """`value` as an int, or a ValueError naming `name` when it is not a positive int."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {name}={value!r}. {example}")
    return int(value)


def pool_size(num_envs: int, batch_size: int | None) -> int:
    """The number of envs in each pool: `num_envs` (synchronous mode) or `batch_size`, which
    must divide `num_envs`."""
    if batch_size is None:
        return num_envs
    size = check_positive_int("batch_size", batch_size, "Pass e.g. batch_size=num_envs // 2.")
    if num_envs % size:
        raise ValueError(
            f"batch_size={size} does not divide num_envs={num_envs}; each received batch holds "
            f"batch_size envs, so use a divisor of {num_envs} such as {num_envs // 2 or 1}, or "
            "batch_size=None for the synchronous mode."
        )
    return size


@dataclass(frozen=True, slots=True)
class StateLayout:
    """Where the parts of a step's result sit in the list EnvPool's C++ pool returns, for the
    direct path of `Pool` (see there)."""

    observation: int
    env_id: int
    reward: int
    done: int
    truncated: int
    action_dtype: np.dtype

    @classmethod
    def of(cls, handle: Any) -> StateLayout | None:
        """The layout of `handle`'s results, or None where the direct path does not apply: a
        multi-player task, an action other than one array, or no single observation array."""
        state_keys = list(getattr(handle, "_state_keys", ()))
        action_keys = list(getattr(handle, "_action_keys", ()))
        needed = ("obs", "info:env_id", "reward", "done", "trunc")
        if action_keys != ["env_id", "players.env_id", "action"]:
            return None
        if handle.config.get("max_num_players", 1) != 1 or any(k not in state_keys for k in needed):
            return None
        if any(key.startswith("obs:") for key in state_keys):
            return None
        index = {key: state_keys.index(key) for key in needed}
        action_dtype = np.dtype(handle.spec.action_array_spec["action"].dtype)
        return cls(
            index["obs"],
            index["info:env_id"],
            index["reward"],
            index["done"],
            index["trunc"],
            action_dtype,
        )


class Pool:
    """One EnvPool of `size` envs, the sub-envs `[start, start + size)` of the batched env.

    It sends, receives and resets through the C++ pool's own `_send` / `_recv` / `_reset` where
    the task has the usual single-player layout: EnvPool's Python wrapper around them rebuilds
    dicts (its config, the info tree) on every call, which measured ~40 us of a ~70 us reset of
    a few CartPole envs, paid on almost every step at 256 envs. Other layouts go through the
    public `send` / `recv` / `reset`. Both give the same arrays (the tests compare them with
    EnvPool's own loop).

    Attributes:
        handle: the EnvPool object (`env_type="gymnasium"`, synchronous).
        start: the index of its first env in the batched env.
        size: its number of envs.
        local_ids: `arange(size)` as EnvPool's env ids (int32), sent with every step.
    """

    __slots__ = ("_layout", "_resetting", "handle", "local_ids", "size", "start")

    def __init__(self, handle: Any, start: int, size: int) -> None:
        self.handle = handle
        self.start = start
        self.size = size
        self.local_ids = np.arange(size, dtype=np.int32)
        self._layout = StateLayout.of(handle)
        self._resetting: np.ndarray | None = None

    @property
    def is_direct(self) -> bool:
        """Whether this pool bypasses EnvPool's Python wrapper (see the class docstring)."""
        return self._layout is not None

    def rows(self, env_ids: np.ndarray) -> slice | np.ndarray:
        """Where a received batch with EnvPool's `env_ids` goes in the batched env's rows: a
        slice when the ids come back in order (the usual case), else an index array."""
        if len(env_ids) == self.size and bool((env_ids == self.local_ids).all()):
            return slice(self.start, self.start + self.size)
        return env_ids + self.start

    def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
        """Start a step of the envs `env_ids` (local, int32) with `actions`."""
        layout = self._layout
        if layout is None:
            self.handle.send(actions, env_ids)
            return
        actions = np.ascontiguousarray(actions, dtype=layout.action_dtype)
        self.handle._send([env_ids, env_ids, actions])

    def recv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The next batch of results: observation, reward, terminated, truncated, env ids."""
        layout = self._layout
        if layout is None:
            observation, reward, terminated, truncated, info = self.handle.recv()
            return observation, reward, terminated, truncated, info["env_id"]
        state = self.handle._recv()
        truncated = state[layout.truncated]
        terminated = state[layout.done] & ~truncated
        return (
            state[layout.observation],
            state[layout.reward],
            terminated,
            truncated,
            state[layout.env_id],
        )

    def start_reset(self, env_ids: np.ndarray | None) -> None:
        """Start resetting the envs `env_ids` (local, int32; all when None) without waiting:
        EnvPool's threads reset them while the caller writes the step's results."""
        if self._layout is None:
            self._resetting = env_ids  # the public `reset` sends and waits in one call
            return
        self.handle._reset(self.local_ids if env_ids is None else env_ids)

    def finish_reset(self) -> tuple[np.ndarray, np.ndarray]:
        """Wait for the reset `start_reset` began: the envs' observations and env ids."""
        if self._layout is None:
            observation, info = self.handle.reset(self._resetting)
            return observation, info["env_id"]
        state = self.handle._recv()
        return state[self._layout.observation], state[self._layout.env_id]


@contextmanager
def quiet_spaces() -> Iterator[None]:
    """Silence Gymnasium's warning on EnvPool's spaces: EnvPool declares float32 boxes with
    float64 bounds, and Gymnasium warns each time one is built."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*precision lowered", UserWarning)
        yield


def make_pools(
    env_id: str,
    num_envs: int,
    size: int,
    seed: int,
    num_threads: int | None,
    make_kwargs: dict[str, Any],
) -> list[Pool]:
    """`num_envs // size` EnvPools of `size` envs; EnvPool seeds env i of a pool with the pool's
    seed + i, so pool g gets `seed + g * size` and sub-env i of the batched env gets `seed + i`,
    as with one pool."""
    envpool = import_envpool()
    if env_id not in envpool.list_all_envs():
        raise ValueError(
            f"env_id={env_id!r} is not an EnvPool task id; `envpool.list_all_envs()` lists them "
            "(e.g. 'CartPole-v1', 'Pong-v5', 'HalfCheetah-v4')."
        )
    pools = []
    for start in range(0, num_envs, size):
        threads = {} if num_threads is None else {"num_threads": num_threads}
        with quiet_spaces():
            handle = envpool.make(
                env_id,
                env_type="gymnasium",
                num_envs=size,
                seed=seed + start,
                **threads,
                **make_kwargs,
            )
            # Gymnasium's spaces are built on first use; build them here, quietly.
            _ = handle.observation_space, handle.action_space
        pools.append(Pool(handle, start, size))
    return pools

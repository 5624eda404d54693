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
class Pool:
    """One EnvPool of `size` envs, the sub-envs `[start, start + size)` of the batched env.

    Attributes:
        handle: the EnvPool object (`env_type="gymnasium"`, synchronous).
        start: the index of its first env in the batched env.
        size: its number of envs.
        local_ids: `arange(size)` as EnvPool's env ids (int32), sent with every step.
    """

    handle: Any
    start: int
    size: int
    local_ids: np.ndarray

    def rows(self, env_ids: np.ndarray) -> slice | np.ndarray:
        """Where a received batch with EnvPool's `env_ids` goes in the batched env's rows: a
        slice when the ids come back in order (the usual case), else an index array."""
        if len(env_ids) == self.size and bool((env_ids == self.local_ids).all()):
            return slice(self.start, self.start + self.size)
        return env_ids + self.start


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
        pools.append(Pool(handle, start, size, np.arange(size, dtype=np.int32)))
    return pools

"""The arguments of the multi-process collectors that concern their worker processes."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

from rlcollect.collectors.children import per_child_factories


def check_worker_arguments(
    *,
    policy: Any,
    policy_factory: Any,
    num_workers: int,
    worker_timeout: Any,
    num_sub_threads: Any,
) -> list[Callable[[], Any] | None]:
    """The arguments of a multi-process collector that concern its workers, checked; returns
    each worker's policy factory (None where the policy itself is sent)."""
    if worker_timeout is not None and not worker_timeout > 0:
        raise ValueError(
            f"worker_timeout={worker_timeout!r} must be a positive number of seconds, or None."
        )
    if isinstance(num_sub_threads, bool) or not isinstance(num_sub_threads, int):
        raise TypeError(f"num_sub_threads must be an int >= 1; got {num_sub_threads!r}.")
    if num_sub_threads < 1:
        raise ValueError(f"num_sub_threads={num_sub_threads} must be at least 1.")
    return per_child_factories(policy, policy_factory, num_workers, "worker")


def in_worker_process() -> bool:
    return multiprocessing.parent_process() is not None

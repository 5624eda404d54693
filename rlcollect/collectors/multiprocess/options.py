"""The arguments of the multi-process collectors that concern their worker processes."""

from __future__ import annotations

import multiprocessing
import numbers
import os
from collections.abc import Callable
from typing import Any

import torch

from rlcollect.collectors.children import per_child_factories


def default_worker_timeout() -> float:
    """Seconds a worker may take to answer unless `worker_timeout` says otherwise: 300, or
    the `MAX_IDLE_COUNT` environment variable, which TorchRL's multi-process collectors read
    (at import, as here) for how long they wait on a silent worker.

    Raises:
        ValueError: `MAX_IDLE_COUNT` set to something other than a positive number.
    """
    given = os.environ.get("MAX_IDLE_COUNT")
    if given is None:
        return 300.0
    try:
        seconds = float(given)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ValueError(
            f"the environment variable MAX_IDLE_COUNT={given!r} must be a positive number of "
            "seconds (how long a collector waits on a silent worker), or unset (300)."
        )
    return seconds


WORKER_TIMEOUT = default_worker_timeout()


def check_worker_arguments(
    *,
    policy: Any,
    policy_factory: Any,
    num_workers: int,
    worker_timeout: Any,
    num_sub_threads: Any,
    init_fn: Any = None,
) -> list[Callable[[], Any] | None]:
    """The arguments of a multi-process collector that concern its workers, checked; returns
    each worker's policy factory (None where the policy itself is sent).

    A policy and a policy factory may come together, as in TorchRL: the workers build their
    policies with the factory, and the policy is where their weights are read from.
    """
    if worker_timeout is not None and not worker_timeout > 0:
        raise ValueError(
            f"worker_timeout={worker_timeout!r} must be a positive number of seconds, or None."
        )
    if isinstance(num_sub_threads, bool) or not isinstance(num_sub_threads, int):
        raise TypeError(f"num_sub_threads must be an int >= 1; got {num_sub_threads!r}.")
    if num_sub_threads < 1:
        raise ValueError(f"num_sub_threads={num_sub_threads} must be at least 1.")
    if init_fn is not None and not callable(init_fn):
        raise TypeError(
            f"init_fn must be a callable taking no argument, run first in every worker; "
            f"got {init_fn!r}."
        )
    return per_child_factories(policy, policy_factory, num_workers, "worker", allow_both=True)


def check_preemptive_threshold(value: Any) -> float | None:
    """TorchRL's `preemptive_threshold` as a float in [0, 1], or None (never preempt; 1.0
    preempts nobody either, as in TorchRL: see `preempts`)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"preemptive_threshold must be a number between 0.0 and 1.0, or None; got "
            f"{value!r} ({type(value).__name__})."
        )
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(
            f"preemptive_threshold={value!r} must be between 0.0 and 1.0 (the share of "
            "workers that finish their batch before the others are cut short), or None."
        )
    return float(value)


def preempts(threshold: float | None) -> bool:
    """Whether a checked `preemptive_threshold` ever cuts a worker's batch short (1.0 waits
    for every worker, as None does)."""
    return threshold is not None and threshold < 1.0


class SharedInterruptor:
    """TorchRL's `_Interruptor` over shared memory: the parent starts and stops collection,
    every worker's collector polls `collection_stopped()` after each env step. It travels to
    the workers as a handle, when they start."""

    def __init__(self) -> None:
        self._collect = torch.ones((), dtype=torch.bool).share_memory_()

    def start_collection(self) -> None:
        self._collect.fill_(True)

    def stop_collection(self) -> None:
        self._collect.fill_(False)

    def collection_stopped(self) -> bool:
        return not bool(self._collect)


def fault_options_for_children(collector_class: Any, **options: Any) -> dict[str, Any]:
    """The fault options (what to do when a worker fails) a worker's collector inherits: all of
    `options` when the worker runs a collector with workers of its own, but those its
    `functools.partial` sets itself; so one setting at the top reaches every level."""
    target = getattr(collector_class, "func", collector_class)
    accepted = getattr(target, "accepts_fault_options", False)
    if not accepted:
        return {}
    own = getattr(collector_class, "keywords", None) or {}
    return {name: value for name, value in options.items() if name not in own}


def in_worker_process() -> bool:
    return multiprocessing.parent_process() is not None


def waits_for_workers() -> bool:
    """Whether the constructor waits until every worker has built its collector (so that a
    failure to build raises there, as TorchRL's does): yes, but in a process of a
    torch.distributed group. There the collector is a node of a launcher (TorchRL's
    `DistributedCollector`) that asks for the node's status within seconds, while workers
    that import torch and build envs on a loaded machine may take longer: the constructor
    returns once they are started (spawned, unless `mp_start_method` says otherwise: a fork
    server blocks its first start until it has imported torch), and a worker that fails to
    build raises at the first call that needs it."""
    distributed = getattr(torch, "distributed", None)
    return not (
        distributed is not None and distributed.is_available() and distributed.is_initialized()
    )

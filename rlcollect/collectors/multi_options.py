"""The arguments of the multi-process collectors: workers, options, seeds, statistics."""

from __future__ import annotations

import difflib
import inspect
import multiprocessing
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlcollect.collectors.bookkeeping import RECENT_EPISODES
from rlcollect.collectors.options import _check_int
from rlcollect.envs.serial import per_worker


def accepted_options(collector_class: Any) -> set[str] | None:
    """The keyword arguments `collector_class` takes (None: it takes any)."""
    target = getattr(collector_class, "func", collector_class)
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters}


def check_options(collector_class: Any, options: Mapping[str, Any]) -> None:
    accepted = accepted_options(collector_class)
    if accepted is None:
        return
    for name in options:
        if name not in accepted:
            close = difflib.get_close_matches(name, sorted(accepted), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise TypeError(
                f"{name!r} is not an option of {getattr(collector_class, '__name__', 'the')} "
                f"collector.{hint}"
            )


def resolve_workers(create_env_fn: Any, num_workers: int | None) -> tuple[list[Any], int]:
    if isinstance(create_env_fn, list | tuple):
        if num_workers is not None and num_workers != len(create_env_fn):
            raise ValueError(
                f"num_workers={num_workers} but create_env_fn lists {len(create_env_fn)} env "
                "makers (one per worker); drop num_workers or make them agree."
            )
        if not create_env_fn:
            raise ValueError("create_env_fn is an empty list; give one env maker per worker.")
        return list(create_env_fn), len(create_env_fn)
    if num_workers is None:
        raise ValueError(
            "num_workers is needed when create_env_fn is a single env maker, e.g. "
            "num_workers=4 (or pass a list with one env maker per worker)."
        )
    num_workers = _check_int("num_workers", num_workers)
    if num_workers < 1:
        raise ValueError(f"num_workers={num_workers} must be at least 1.")
    return [create_env_fn] * num_workers, num_workers


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
    if policy is not None and policy_factory is not None:
        raise ValueError("pass policy or policy_factory, not both.")
    if isinstance(num_sub_threads, bool) or not isinstance(num_sub_threads, int):
        raise TypeError(f"num_sub_threads must be an int >= 1; got {num_sub_threads!r}.")
    if num_sub_threads < 1:
        raise ValueError(f"num_sub_threads={num_sub_threads} must be at least 1.")
    factories = per_worker("policy_factory", policy_factory, num_workers)
    for factory in factories:
        if factory is not None and not callable(factory):
            raise TypeError(
                f"policy_factory must be a callable returning a policy (or one per worker); "
                f"got {factory!r}."
            )
    return factories


def in_worker_process() -> bool:
    return multiprocessing.parent_process() is not None


def check_seed(seed: Any) -> int:
    """`seed` as an int that fits the worker protocol (int64), or an error naming it."""
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int; got {seed!r} ({type(seed).__name__}).")
    if not -(2**63) <= int(seed) < 2**63:
        raise ValueError(f"seed={seed} does not fit in 64 bits; use a smaller seed.")
    return int(seed)


def episode_statistics(workers: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The episode statistics of `Collector.stats()` over all workers: episodes summed, the
    mean returns averaged over the workers that have finished any (weighted by how many
    episodes each window holds)."""
    episodes = sum(int(worker.get("episodes", 0)) for worker in workers)
    last = [w["mean_episode_return"] for w in workers if w.get("episodes", 0) > 0]
    windows = [
        (w["mean_return_last_100"], min(int(w["episodes"]), RECENT_EPISODES))
        for w in workers
        if w.get("episodes", 0) > 0
    ]
    weight = sum(count for _, count in windows)
    return {
        "episodes": episodes,
        "mean_episode_return": sum(last) / len(last) if last else float("nan"),
        "mean_return_last_100": (
            sum(value * count for value, count in windows) / weight if weight else float("nan")
        ),
    }

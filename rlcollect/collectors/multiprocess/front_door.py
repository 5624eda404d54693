"""TorchRL's names for the multi-process collectors: `MultiCollector(sync=...)`,
`AsyncCollector` (one env collected in a background process), and the "process" backend of
`Collector(..., num_collectors=N)`."""

from __future__ import annotations

import abc
from typing import Any

from rlcollect.collectors.multiprocess.async_collector import MultiAsyncCollector
from rlcollect.collectors.multiprocess.base import MultiCollectorBase
from rlcollect.collectors.multiprocess.sync_collector import MultiSyncCollector
from rlcollect.collectors.single.front_door import register_backend
from rlcollect.runtime.fan_out import is_sequence


def build_multiprocess(args: tuple[Any, ...], kwargs: dict[str, Any], sync: bool) -> Any:
    """`MultiSyncCollector(*args, **kwargs)` or `MultiAsyncCollector(...)`, as `sync` says."""
    collector_class = MultiSyncCollector if sync else MultiAsyncCollector
    return collector_class(*args, **kwargs)


def _process_backend(
    args: tuple[Any, ...], kwargs: dict[str, Any], num_collectors: int, sync: bool
) -> Any:
    # `create_env_fn` already lists one maker per worker: it gives the number of workers.
    return build_multiprocess(args, kwargs, sync)


register_backend("process", _process_backend)


class MultiCollector(abc.ABC):  # noqa: B024  # no abstract method: a name that dispatches
    """TorchRL's `MultiCollector(..., sync=...)`: builds a `MultiSyncCollector` (`sync=True`)
    or a `MultiAsyncCollector` (`sync=False`) with the other arguments.

    Both are virtual subclasses, so `isinstance(collector, MultiCollector)` holds for either,
    as it does in TorchRL.

    Raises:
        TypeError: `sync` missing or not a bool (TorchRL builds its abstract base then; here
            there is nothing to build).

    Examples:
        >>> from rlcollect.collectors import MultiCollector, MultiSyncCollector
        >>> with MultiCollector(
        ...     "CartPole-v1", num_workers=2, frames_per_batch=100, total_frames=100, sync=True
        ... ) as collector:
        ...     print(type(collector).__name__, isinstance(collector, MultiCollector))
        MultiSyncCollector True
    """

    def __new__(cls, *args: Any, sync: bool | None = None, **kwargs: Any) -> Any:
        if not isinstance(sync, bool):
            raise TypeError(
                f"MultiCollector needs sync=True (MultiSyncCollector) or sync=False "
                f"(MultiAsyncCollector); got sync={sync!r}."
            )
        return build_multiprocess(args, kwargs, sync)


MultiCollector.register(MultiCollectorBase)


class AsyncCollector(MultiAsyncCollector):
    """TorchRL's `AsyncCollector`: one env collected in one background worker process.

    The worker collects its next batch while the caller trains on the last one, so a batch
    may come from weights one update older (as in TorchRL; use `Collector` for on-policy
    data). Takes `MultiAsyncCollector`'s arguments for one worker, with one env maker.

    Raises:
        TypeError: a list of env makers, or `num_workers` (there is one worker).

    Examples:
        >>> from rlcollect.collectors import AsyncCollector
        >>> with AsyncCollector("CartPole-v1", frames_per_batch=50, total_frames=100) as collector:
        ...     print([data.batch_size for data in collector])
        [torch.Size([50]), torch.Size([50])]
    """

    takes_env_maker_list = False  # one env, one worker

    def __init__(self, create_env_fn: Any, policy: Any = None, **options: Any) -> None:
        if is_sequence(create_env_fn):
            raise TypeError(
                f"AsyncCollector collects one env; got a list of {len(create_env_fn)} env "
                "makers. Use MultiAsyncCollector for one worker per maker."
            )
        if "num_workers" in options:
            raise TypeError(
                "AsyncCollector runs one worker; drop num_workers (or use MultiAsyncCollector)."
            )
        super().__init__([create_env_fn], policy, **options)

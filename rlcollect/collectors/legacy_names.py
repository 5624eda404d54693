"""TorchRL's collector names before 0.12, which TorchRL 0.14 removed: code written for TorchRL
0.10 or 0.11 runs here by changing its import (`from rlcollect import SyncDataCollector`).

TorchRL 0.10's constructors take the arguments TorchRL 0.14's take, save one: its multi-process
collectors still took `replay_buffer_chunk`, the name `extend_buffer` had until 0.9. Those
classes take it as TorchRL 0.10 did (a `DeprecationWarning`, then `extend_buffer`); the other
names are the classes themselves.
"""

from __future__ import annotations

import warnings
from typing import Any

from rlcollect.collectors.base import CollectorBase
from rlcollect.collectors.multiprocess.async_collector import MultiAsyncCollector
from rlcollect.collectors.multiprocess.front_door import AsyncCollector
from rlcollect.collectors.multiprocess.sync_collector import MultiSyncCollector
from rlcollect.collectors.single.collector import Collector

# TorchRL 0.10's `SyncDataCollector.__init__` takes no argument our `Collector` does not.
SyncDataCollector = Collector
# TorchRL 0.10's base of every collector: ours (TorchRL's `BaseCollector` counts ours as its own).
DataCollectorBase = CollectorBase


def with_extend_buffer(replay_buffer_chunk: bool | None, options: dict[str, Any]) -> dict[str, Any]:
    """`options` with TorchRL 0.10's `replay_buffer_chunk` passed on as `extend_buffer`.

    Raises:
        ValueError: both given, with different values (TorchRL 0.10 refused that too).
    """
    if replay_buffer_chunk is None:
        return options
    warnings.warn(
        "replay_buffer_chunk is the old name of extend_buffer; pass extend_buffer instead.",
        DeprecationWarning,
        stacklevel=3,
    )
    extend_buffer = options.get("extend_buffer", replay_buffer_chunk)
    if extend_buffer != replay_buffer_chunk:
        raise ValueError(
            f"replay_buffer_chunk={replay_buffer_chunk!r} and extend_buffer={extend_buffer!r} "
            "disagree; replay_buffer_chunk is the old name of extend_buffer: pass only "
            "extend_buffer."
        )
    return {**options, "extend_buffer": extend_buffer}


class TakesReplayBufferChunk:
    """Mixin: the constructor takes TorchRL 0.10's `replay_buffer_chunk` (see
    `with_extend_buffer`) and passes the rest on to the collector class after it."""

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        replay_buffer_chunk: bool | None = None,
        **options: Any,
    ) -> None:
        super().__init__(  # type: ignore[call-arg]
            create_env_fn, policy, **with_extend_buffer(replay_buffer_chunk, options)
        )


class MultiSyncDataCollector(TakesReplayBufferChunk, MultiSyncCollector):
    """TorchRL 0.10's name of `MultiSyncCollector`, taking that version's arguments.

    Examples:
        >>> from rlcollect import MultiSyncDataCollector
        >>> with MultiSyncDataCollector(
        ...     "CartPole-v1", num_workers=2, frames_per_batch=100, total_frames=100
        ... ) as collector:
        ...     print([data.batch_size for data in collector])
        [torch.Size([2, 50])]
    """


class MultiaSyncDataCollector(TakesReplayBufferChunk, MultiAsyncCollector):
    """TorchRL 0.10's name of `MultiAsyncCollector`, taking that version's arguments."""


# TorchRL 0.10's spelling
class aSyncDataCollector(TakesReplayBufferChunk, AsyncCollector):  # noqa: N801
    """TorchRL 0.10's name of `AsyncCollector`, taking that version's arguments."""

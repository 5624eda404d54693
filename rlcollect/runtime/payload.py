"""`WorkerPayload`: what a worker process is given to build from (an env maker, a spec).

It travels with cloudpickle, so lambdas and closures work. Yet some objects only
multiprocessing's own pickler may send, and only while it starts a process: a shared
`multiprocessing.Value` or `Array`, a lock, a queue, a pipe's end (a `TrajCounter` transform's
shared count in a TorchRL `EnvCreator`, say). cloudpickle cannot send them (`Synchronized
objects should only be shared between processes through inheritance`). A payload sets them
aside while cloudpickle packs the rest, and keeps them beside the packed bytes: handed to the
worker as an argument of its `Process`, the payload is pickled by multiprocessing as the
process starts, where sharing them is allowed, so the worker shares them with its parent (and
with every other worker given them), as with TorchRL's workers. A payload handed over again
(a worker restarted) hands them over again.
"""

from __future__ import annotations

import ctypes
import io
import multiprocessing.connection
import multiprocessing.heap
import multiprocessing.managers
import multiprocessing.queues
import multiprocessing.sharedctypes
import multiprocessing.synchronize
import pickle
from typing import Any

import cloudpickle

# What multiprocessing shares only with a process it starts: its locks and semaphores (a
# condition holds some), its shared values and arrays, queues, pipe ends, manager proxies.
SHARED_ON_START: tuple[type, ...] = (
    multiprocessing.synchronize.SemLock,
    multiprocessing.synchronize.Condition,
    multiprocessing.sharedctypes.SynchronizedBase,
    multiprocessing.heap.BufferWrapper,
    multiprocessing.queues.Queue,
    multiprocessing.queues.SimpleQueue,
    multiprocessing.connection.Connection,
    multiprocessing.managers.BaseProxy,
)
_CTYPES = (ctypes._SimpleCData, ctypes.Array, ctypes.Structure)


def is_shared_on_start(obj: Any) -> bool:
    """Whether only multiprocessing may send `obj`, as it starts a process: one of
    `SHARED_ON_START`, or a ctypes object in multiprocessing's shared memory (`RawValue`,
    `RawArray`)."""
    if isinstance(obj, SHARED_ON_START):
        return True
    return isinstance(obj, _CTYPES) and isinstance(
        getattr(obj, "_wrapper", None), multiprocessing.heap.BufferWrapper
    )


class _SettingAside(cloudpickle.Pickler):
    """cloudpickle, but what is shared on start is referred to by its index in `aside`."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file)
        self.aside: list[Any] = []
        self._indices: dict[int, int] = {}

    def persistent_id(self, obj: Any) -> int | None:  # type: ignore[override]
        if not is_shared_on_start(obj):
            return None
        index = self._indices.get(id(obj))
        if index is None:
            index = self._indices[id(obj)] = len(self.aside)
            self.aside.append(obj)
        return index


class _TakingBack(pickle.Unpickler):
    """Unpickles a payload's bytes, with what was set aside put back in its place."""

    def __init__(self, file: io.BytesIO, aside: list[Any]) -> None:
        super().__init__(file)
        self.aside = aside

    def persistent_load(self, pid: Any) -> Any:
        return self.aside[pid]


class WorkerPayload:
    """`value`, packed for a worker process (see the module).

    Args:
        value: anything cloudpickle packs, holding shared multiprocessing objects or not.

    Examples:
        >>> import multiprocessing
        >>> counter = multiprocessing.get_context("spawn").Value("i", 0)
        >>> payload = WorkerPayload({"count": counter, "make": lambda: 3})
        >>> len(payload.aside)
        1
        >>> value = payload.load()
        >>> value["count"] is counter, value["make"]()
        (True, 3)
    """

    def __init__(self, value: Any) -> None:
        buffer = io.BytesIO()
        pickler = _SettingAside(buffer)
        pickler.dump(value)
        self.data = buffer.getvalue()
        # Pickled by multiprocessing with the process's arguments (not by cloudpickle).
        self.aside = pickler.aside

    def load(self) -> Any:
        """The value (in the worker: with the shared objects multiprocessing handed over)."""
        return _TakingBack(io.BytesIO(self.data), self.aside).load()

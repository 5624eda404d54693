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

Made with `share_tensors=True` (an env maker's payload), a payload also sets aside the CPU
tensors in shared memory it holds (`share_memory_()`, the shared state of a TorchRL
`EnvCreator`): multiprocessing's pickler sends them with torch's reductions, as handles to the
same storage, so a worker's write is seen by this process and the other workers (under "fork"
the worker inherits the mapping). A payload inside a payload (the env maker's, inside the
worker's spec) is set aside whole and loaded in place. Each storage sent so costs one file
descriptor at the start (under torch's "file_descriptor" strategy, and the fork server takes at
most 255): a maker holding more than `DESCRIPTOR_BUDGET` shared storages is copied, with a
warning, as it was before.
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
import warnings
from typing import Any

import cloudpickle
import torch
import torch.multiprocessing

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
# Shared storages one payload may send as descriptors: the fork server passes at most 255 per
# process start, and the worker's pipes and the other arguments need some.
DESCRIPTOR_BUDGET = 128


def is_shared_on_start(obj: Any) -> bool:
    """Whether only multiprocessing may send `obj`, as it starts a process: one of
    `SHARED_ON_START`, or a ctypes object in multiprocessing's shared memory (`RawValue`,
    `RawArray`)."""
    if isinstance(obj, SHARED_ON_START):
        return True
    if isinstance(obj, WorkerPayload):
        return True
    return isinstance(obj, _CTYPES) and isinstance(
        getattr(obj, "_wrapper", None), multiprocessing.heap.BufferWrapper
    )


def is_shared_tensor(obj: Any) -> bool:
    """Whether `obj` is a CPU tensor in shared memory that torch's reductions send as a handle
    (a CUDA tensor stays copied; a non-leaf tensor that requires grad cannot travel so)."""
    if not isinstance(obj, torch.Tensor) or obj.device.type != "cpu" or obj.is_sparse:
        return False
    if obj.requires_grad and not obj.is_leaf:
        return False
    return obj.is_shared()


def shared_storages(aside: list[Any]) -> int:
    """How many distinct storages the shared tensors in `aside` hold."""
    return len(
        {item.untyped_storage().data_ptr() for item in aside if isinstance(item, torch.Tensor)}
    )


class _SettingAside(cloudpickle.Pickler):
    """cloudpickle, but what is shared on start (and, with `share_tensors`, a tensor in shared
    memory) is referred to by its index in `aside`."""

    def __init__(self, file: io.BytesIO, share_tensors: bool) -> None:
        super().__init__(file)
        self.share_tensors = share_tensors
        self.aside: list[Any] = []
        self._indices: dict[int, int] = {}

    def persistent_id(self, obj: Any) -> int | None:  # type: ignore[override]
        if not is_shared_on_start(obj) and not (self.share_tensors and is_shared_tensor(obj)):
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
        self._loaded: dict[int, Any] = {}

    def persistent_load(self, pid: Any) -> Any:
        item = self.aside[pid]
        if not isinstance(item, WorkerPayload):
            return item
        if pid not in self._loaded:  # one object however often the value refers to it
            self._loaded[pid] = item.load()
        return self._loaded[pid]


class WorkerPayload:
    """`value`, packed for a worker process (see the module).

    Args:
        value: anything cloudpickle packs, holding shared multiprocessing objects or not.
        share_tensors: whether the CPU tensors in shared memory `value` holds reach the worker
            shared too (an env maker's state), rather than copied (a policy, whose copy in the
            worker changes only when weights are sent).

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

    def __init__(self, value: Any, share_tensors: bool = False) -> None:
        self.data, self.aside = _packed(value, share_tensors)
        if share_tensors and _over_budget(self.aside):
            warnings.warn(
                f"an env maker holds tensors in {shared_storages(self.aside)} shared-memory "
                f"storages, more than the {DESCRIPTOR_BUDGET} a worker can be handed as file "
                f"descriptors: the workers get copies. Call torch.multiprocessing."
                f"set_sharing_strategy('file_system') before building the collector to share "
                f"them all.",
                stacklevel=2,
            )
            self.data, self.aside = _packed(value, share_tensors=False)

    def load(self) -> Any:
        """The value (in the worker: with the shared objects multiprocessing handed over)."""
        return _TakingBack(io.BytesIO(self.data), self.aside).load()


def _packed(value: Any, share_tensors: bool) -> tuple[bytes, list[Any]]:
    """`value`'s cloudpickled bytes, and what was set aside (pickled by multiprocessing with
    the process's arguments, not by cloudpickle)."""
    buffer = io.BytesIO()
    pickler = _SettingAside(buffer, share_tensors)
    pickler.dump(value)
    return buffer.getvalue(), pickler.aside


def _over_budget(aside: list[Any]) -> bool:
    """Whether sending `aside`'s shared storages would take more descriptors than allowed."""
    strategy = torch.multiprocessing.get_sharing_strategy()
    return strategy == "file_descriptor" and shared_storages(aside) > DESCRIPTOR_BUDGET

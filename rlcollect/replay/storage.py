"""The storage contract of replay buffers, and ListStorage for arbitrary Python objects."""

from __future__ import annotations

import abc
import os
from collections.abc import Sequence
from multiprocessing.context import get_spawning_popen
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from tensordict import TensorDictBase

from rlcollect.errors import MisuseError
from rlcollect.replay.commit_log import NUM_CELLS, CommitLog
from rlcollect.replay.storage_lock import StorageLock


class Frames(NamedTuple):
    """A batch of frames checked against a storage and ready to be written to it.

    Examples:
        >>> frames = Frames(3, [torch.arange(3)])
        >>> frames.tail(2).values
        [tensor([1, 2])]
    """

    num_frames: int
    values: Any
    layout: Any = None

    def tail(self, count: int) -> Frames:
        """The last ``count`` frames."""
        if count == self.num_frames:
            return self
        start = self.num_frames - count
        return Frames(count, [value[start:] for value in self.values], self.layout)


def check_max_size(max_size: int) -> int:
    """Returns ``max_size`` as an int, or raises a ValueError saying what a valid size is."""
    if isinstance(max_size, bool) or not isinstance(max_size, (int, np.integer)) or max_size <= 0:
        raise ValueError(
            f"max_size must be a positive int, got {max_size!r}; pass the number of frames the "
            "storage should hold, e.g. max_size=100_000."
        )
    return int(max_size)


class Storage(abc.ABC):
    """Where a replay buffer keeps its items: ``max_size`` slots written in circular order.

    Contract:

    - ``log`` (a :class:`~rlcollect.replay.commit_log.CommitLog`) holds the cursor, the length and
      the write count. The items are the ``len(storage)`` slots that end just before the cursor
      (circularly): ``log.window_start(max_size)`` is the slot of the oldest one.
    - ``lock`` serializes every transaction (threads, and processes for shared storages). Reads
      and writes of slots or of the log happen while holding it.
    - :meth:`prepare` checks a batch and returns its :class:`Frames` *without changing anything*;
      a batch that does not fit the storage raises there.
    - :meth:`write` stores prepared frames in consecutive slots from ``start`` (wrapping around);
      the writer brackets it with ``log.begin`` / ``log.commit``.
    - :meth:`get` returns the items at slot indices as one batch (one item for an int index).

    Examples:
        >>> storage = ListStorage(3)
        >>> with storage.lock:
        ...     frames = storage.prepare(["a", "b"], batch_dims=1)
        ...     storage.log.begin(frames.num_frames)
        ...     storage.write(storage.log.cursor, frames)
        ...     storage.log.commit(cursor=2, length=2, write_count=2)
        >>> len(storage), storage.get(1)
        (2, 'b')
    """

    max_size: int
    log: CommitLog
    lock: StorageLock
    _owner_pid: int

    def __len__(self) -> int:
        return self.log.length

    @property
    def is_shared(self) -> bool:
        """Whether other processes can write to and read from this storage."""
        return False

    @abc.abstractmethod
    def prepare(self, data: Any, batch_dims: int) -> Frames:
        """Checks ``data`` (``batch_dims`` leading dims of frames) and returns its frames."""

    @abc.abstractmethod
    def write(self, start: int, frames: Frames) -> None:
        """Writes ``frames`` into slots ``start, start + 1, ...`` modulo ``max_size``."""

    @abc.abstractmethod
    def get(self, index: torch.Tensor | int) -> Any:
        """The items at slot ``index`` (a 1-D long tensor, or an int for one item)."""

    @abc.abstractmethod
    def read_column(self, key: str | tuple[str, ...], index: torch.Tensor) -> torch.Tensor:
        """The entry ``key`` of the items at slots ``index``, stacked."""

    def __getitem__(self, index: torch.Tensor | int | slice | Sequence[int]) -> Any:
        """Items by slot: an int, a slice over the stored items, a list or a 1-D tensor.

        Takes the lock, as every read does: it maps what other processes wrote to a shared
        storage, and no writer is halfway through the slots read.
        """
        with self.lock:
            if isinstance(index, slice):
                return self.get(torch.arange(*index.indices(len(self))))
            if isinstance(index, torch.Tensor) and index.ndim == 0:
                return self.get(int(index))
            if not isinstance(index, (int, torch.Tensor)):
                index = torch.as_tensor(index, dtype=torch.long)
            return self.get(index)

    def empty(self) -> None:
        """Forgets every item and resets the cursor and the write count."""
        with self.lock:
            self.log.reset()

    def share(self) -> None:
        """Moves the storage where worker processes can write to it.

        Raises:
            ValueError: this kind of storage cannot be shared.
        """
        raise ValueError(
            f"{type(self).__name__} cannot be shared between processes; use LazyTensorStorage "
            "or LazyMemmapStorage with shared=True."
        )

    def check_writable_here(self) -> None:
        """Refuses writes from a forked process to a private copy, whose items would be lost.

        Raises:
            MisuseError: this process is a fork of the one that owns a non-shared storage.
        """
        if not self.is_shared and self._owner_pid != os.getpid():
            raise MisuseError(
                f"this {type(self).__name__} belongs to process {self._owner_pid} and is not "
                f"shared, so writes from process {os.getpid()} would be lost; build the replay "
                "buffer with shared=True to write to it from worker processes."
            )

    def refuse_private_spawn(self) -> None:
        """Refuses to be pickled for a child process when the child would get a private copy.

        Raises:
            MisuseError: a non-shared storage is being sent to a new process.
        """
        if not self.is_shared and get_spawning_popen() is not None:
            raise MisuseError(
                f"a non-shared {type(self).__name__} was sent to a new process, which would "
                "write to a private copy; build the replay buffer with shared=True."
            )

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The items and the log, as a picklable dict."""

    @abc.abstractmethod
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned."""

    @abc.abstractmethod
    def dumps(self, path: str | Path) -> None:
        """Saves the storage into the directory ``path``."""

    @abc.abstractmethod
    def loads(self, path: str | Path) -> None:
        """Restores a storage saved with :meth:`dumps`."""

    def close(self) -> None:
        """Releases what the storage holds outside Python (files, shared memory)."""
        return None


def collate(items: list[Any]) -> Any:
    """Stacks TensorDicts or tensors, makes numbers a tensor, and leaves other items in a list."""
    if items and all(isinstance(item, TensorDictBase) for item in items):
        return torch.stack(items)
    if items and all(isinstance(item, torch.Tensor) for item in items):
        return torch.stack(items)
    if items and all(isinstance(item, (int, float, bool)) for item in items):
        return torch.tensor(items)
    return items


class ListStorage(Storage):
    """A storage of any Python objects, kept in a list of ``max_size`` slots.

    Args:
        max_size: the number of items it holds; older items are overwritten past it.

    Examples:
        >>> from rlcollect.replay import ListStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=ListStorage(max_size=3))
        >>> rb.extend(["a", {"b": 1}, None, 4])
        tensor([0, 1, 2, 0])
        >>> rb.storage.get(torch.tensor([1, 2, 0]))
        [{'b': 1}, None, 4]
    """

    def __init__(self, max_size: int) -> None:
        self.max_size = check_max_size(max_size)
        self._items: list[Any] = [None] * self.max_size
        self.log = CommitLog(np.zeros(NUM_CELLS, dtype=np.int64))
        self.lock = StorageLock(on_acquire=self._on_acquire)
        self._owner_pid = os.getpid()

    def _on_acquire(self) -> None:
        self.log.recover(self.max_size)

    def prepare(self, data: Any, batch_dims: int) -> Frames:
        if isinstance(data, (TensorDictBase, torch.Tensor)):
            flat = data.reshape(-1, *data.shape[batch_dims:]) if batch_dims != 1 else data
            items = list(flat.unbind(0))
        else:
            items = list(data)
        return Frames(len(items), [items])

    def write(self, start: int, frames: Frames) -> None:
        (items,) = frames.values
        for offset, item in enumerate(items):
            self._items[(start + offset) % self.max_size] = item

    def get(self, index: torch.Tensor | int) -> Any:
        if isinstance(index, int):
            return self._items[index]
        return collate([self._items[i] for i in index.tolist()])

    def read_column(self, key: str | tuple[str, ...], index: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.as_tensor(self._items[i][key]) for i in index.tolist()])

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            return {"items": list(self._items), "log": self.log.snapshot()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        items = state_dict["items"]
        if len(items) != self.max_size:
            raise ValueError(
                f"the saved ListStorage holds {len(items)} slots but this one has "
                f"max_size={self.max_size}; load into a storage of the same size."
            )
        with self.lock:
            self._items = list(items)
            self.log.reset(*state_dict["log"])

    def dumps(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), path / "list_storage.pt")

    def loads(self, path: str | Path) -> None:
        state = torch.load(Path(path) / "list_storage.pt", weights_only=False)
        self.load_state_dict(state)

    def __getstate__(self) -> dict[str, Any]:
        self.refuse_private_spawn()
        state = self.__dict__.copy()
        state["log"] = self.log.snapshot()
        del state["lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        snapshot = state.pop("log")
        self.__dict__.update(state)
        self.log = CommitLog(np.zeros(NUM_CELLS, dtype=np.int64))
        self.log.reset(*snapshot)
        self.lock = StorageLock(on_acquire=self._on_acquire)
        self._owner_pid = os.getpid()

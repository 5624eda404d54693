"""Storages of tensor frames allocated from their first write: TensorStorage, LazyTensorStorage."""

from __future__ import annotations

import os
import tempfile
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rlcollect.errors import MisuseError
from rlcollect.replay.commit_log import NUM_CELLS, CommitLog
from rlcollect.replay.layout import FrameLayout
from rlcollect.replay.storage import Frames, Storage, check_max_size
from rlcollect.replay.storage_directory import (
    StorageDirectory,
    remove_directory,
    shared_memory_root,
)
from rlcollect.replay.storage_lock import StorageLock


def _numpy_view(leaf: torch.Tensor) -> np.ndarray | None:
    if leaf.device.type != "cpu":
        return None
    try:
        return leaf.numpy()
    except (TypeError, RuntimeError):  # dtypes without a NumPy equivalent
        return None


class TensorStorage(Storage):
    """The common part of tensor storages: one preallocated ``[max_size, *shape]`` tensor per leaf.

    The leaves live in process memory (on ``device``) or, for shared and memory-mapped storages,
    in the files of a :class:`~rlcollect.replay.storage_directory.StorageDirectory`, which any
    process can open. Writes copy whole slot ranges per leaf; reads gather each leaf in one
    call (NumPy's ``take`` on the CPU, ``index_select`` elsewhere).

    Args:
        max_size: the number of frames it holds.
        device: where the frames live (memory storages) or are returned (file storages).

    Examples:
        >>> storage = TensorStorage(4)
        >>> with storage.lock:
        ...     frames = storage.prepare(torch.arange(6.0).reshape(3, 2), batch_dims=1)
        ...     storage.write(2, frames)  # slots 2, 3, then 0
        >>> storage.get(torch.tensor([0, 2])).tolist()
        [[4.0, 5.0], [0.0, 1.0]]
    """

    def __init__(self, max_size: int, device: torch.device | str = "cpu") -> None:
        self.max_size = check_max_size(max_size)
        self.device = torch.device(device)
        self._set_leaves(None, None)
        self._directory: StorageDirectory | None = None
        self._durable = False
        self._owner_pid = os.getpid()
        self.log = CommitLog(np.zeros(NUM_CELLS, dtype=np.int64))
        self.lock = StorageLock(on_acquire=self._on_acquire)

    @property
    def is_shared(self) -> bool:
        return self._directory is not None

    @property
    def initialized(self) -> bool:
        """Whether the first write fixed the layout and allocated the leaves."""
        return self._leaves is not None

    def _use_directory(self, directory: StorageDirectory) -> None:
        self._directory = directory
        self.max_size = directory.max_size
        self.log = CommitLog(directory.cells, directory.tallies)
        self.lock = directory.lock
        self.lock.on_acquire = self._on_acquire

    def _on_acquire(self) -> None:
        if self._leaves is None and self._directory is not None:
            # Another process may have written the first batch since we looked.
            layout = self._directory.read_layout()
            if layout is not None:
                self._set_leaves(layout, self._directory.map_leaves(layout))
        self.log.recover(self.max_size)

    def _initialize(self, layout: FrameLayout) -> None:
        if self._directory is None:
            leaves = [
                torch.zeros((self.max_size, *leaf.shape), dtype=leaf.dtype, device=self.device)
                for leaf in layout.leaves
            ]
        else:
            self._directory.allocate(layout)
            leaves = self._directory.map_leaves(layout)
        self._set_leaves(layout, leaves)

    def _set_leaves(self, layout: FrameLayout | None, leaves: list[torch.Tensor] | None) -> None:
        self.layout = layout
        self._leaves = leaves
        # NumPy's take gathers small rows about twice as fast as index_select; leaves NumPy
        # cannot view (accelerators, bfloat16) keep torch's gather.
        self._arrays = [_numpy_view(leaf) for leaf in leaves or ()]

    def prepare(self, data: Any, batch_dims: int) -> Frames:
        if isinstance(data, list) and data and all(isinstance(x, TensorDictBase) for x in data):
            data = torch.stack(data)  # a list of TensorDicts: one item each, as in TorchRL
            batch_dims = data.batch_dims
        layout = self.layout or FrameLayout.from_batch(data, batch_dims)
        values = layout.frames_of(data, batch_dims)
        return Frames(values[0].shape[0], values, layout)

    def write(self, start: int, frames: Frames) -> None:
        if self._leaves is None:
            self._initialize(frames.layout)
        _, leaves = self._require_leaves()
        count = frames.num_frames
        head = min(count, self.max_size - start)
        for leaf, value in zip(leaves, frames.values, strict=True):
            if head == count:
                leaf[start : start + count].copy_(value)
            else:
                leaf[start:].copy_(value[:head])
                leaf[: count - head].copy_(value[head:])
        if self._durable and self._directory is not None:
            self._directory.flush(start, head)
            if head < count:
                self._directory.flush(0, count - head)

    def _require_leaves(self) -> tuple[FrameLayout, list[torch.Tensor]]:
        if self._leaves is None or self.layout is None:
            raise MisuseError(
                f"the {type(self).__name__} holds no data yet; extend the buffer before reading it."
            )
        return self.layout, self._leaves

    def _output(self, values: list[torch.Tensor]) -> list[torch.Tensor]:
        if self._directory is not None and self.device.type != "cpu":
            return [value.to(self.device, non_blocking=True) for value in values]
        return values

    def get(self, index: torch.Tensor | int) -> TensorDict | torch.Tensor:
        layout, leaves = self._require_leaves()
        if isinstance(index, int):
            item = [leaf[index].clone() for leaf in leaves]
            return layout.assemble(self._output(item), torch.Size())
        positions = index.numpy() if index.device.type == "cpu" else index.cpu().numpy()
        values = [
            torch.from_numpy(array.take(positions, axis=0))
            if array is not None
            else torch.index_select(leaf, 0, index.to(leaf.device))
            for leaf, array in zip(leaves, self._arrays, strict=True)
        ]
        return layout.assemble(self._output(values), torch.Size([len(positions)]))

    def read_column(self, key: str | tuple[str, ...], index: torch.Tensor) -> torch.Tensor:
        layout, leaves = self._require_leaves()
        leaf = leaves[layout.index_of(key)]
        return torch.index_select(leaf, 0, index.to(leaf.device))

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            return {
                "max_size": self.max_size,
                "layout": None if self.layout is None else self.layout.to_json(),
                "leaves": None if self._leaves is None else [leaf.clone() for leaf in self._leaves],
                "log": self.log.snapshot(),
            }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._check_saved_size(state_dict["max_size"])
        layout_json = state_dict["layout"]
        with self.lock:
            if layout_json is not None:
                self._adopt_layout(FrameLayout.from_json(layout_json))
                for leaf, saved in zip(
                    self._require_leaves()[1], state_dict["leaves"], strict=True
                ):
                    leaf.copy_(saved)
            self.log.reset(*state_dict["log"])

    def _check_saved_size(self, max_size: int) -> None:
        if max_size != self.max_size:
            raise ValueError(
                f"the saved storage holds max_size={max_size} frames but this one holds "
                f"max_size={self.max_size}; load it into a storage of the same max_size."
            )

    def _adopt_layout(self, layout: FrameLayout) -> None:
        if self.layout is None:
            self._initialize(layout)
        elif self.layout != layout:
            raise ValueError(
                "the saved storage's keys, dtypes or shapes differ from this storage's; load it "
                "into a fresh storage."
            )

    def dumps(self, path: str | Path) -> None:
        target = StorageDirectory(path, self.max_size)
        if self._directory is not None and target.path == self._directory.path:
            return
        with self.lock:
            if self.layout is not None and self._leaves is not None:
                if target.read_layout() != self.layout:
                    target.allocate(self.layout)
                for saved, leaf in zip(target.map_leaves(self.layout), self._leaves, strict=True):
                    saved.copy_(leaf)
            CommitLog(target.cells).reset(*self.log.snapshot())
        target.lock.close()

    def loads(self, path: str | Path) -> None:
        source = StorageDirectory(path, None)
        self._check_saved_size(source.max_size)
        layout = source.read_layout()
        with self.lock:
            if layout is not None:
                self._adopt_layout(layout)
                for leaf, saved in zip(
                    self._require_leaves()[1], source.map_leaves(layout), strict=True
                ):
                    leaf.copy_(saved)
            self.log.reset(*CommitLog(source.cells).snapshot())
        source.lock.close()

    def __getstate__(self) -> dict[str, Any]:
        if self._directory is not None:
            return {"directory": str(self._directory.path), **self._settings()}
        self.refuse_private_spawn()
        return {"state": self.state_dict(), **self._settings()}

    def _settings(self) -> dict[str, Any]:
        return {"max_size": self.max_size, "device": str(self.device), "durable": self._durable}

    def __setstate__(self, state: dict[str, Any]) -> None:
        TensorStorage.__init__(self, state["max_size"], state["device"])
        self._durable = state["durable"]
        if "directory" in state:
            # Open only: a handle must not recreate a storage its owner already removed.
            self._use_directory(StorageDirectory(state["directory"], None))
            with self.lock:
                pass  # maps the leaves if another process already wrote
        else:
            self.load_state_dict(state["state"])

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(max_size={self.max_size}, len={len(self)}, device={self.device})"


class LazyTensorStorage(TensorStorage):
    """A storage of TensorDicts (or tensors) allocated, zero-filled, from the first write.

    Each leaf becomes one ``[max_size, *shape]`` tensor on ``device``. With ``shared=True`` on the
    replay buffer (:meth:`share`), the leaves and the commit log move to shared memory files
    (``/dev/shm``) that worker processes open, and that are removed with the owning storage.

    Args:
        max_size: the number of frames it holds; older frames are overwritten past it.

    Keyword Args:
        device: where the frames live. Defaults to ``"cpu"``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from rlcollect.replay import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=4)
        >>> rb.extend(TensorDict({"observation": torch.randn(10, 3)}, [10]))[:3]
        tensor([0, 1, 2])
        >>> rb.sample()["observation"].shape
        torch.Size([4, 3])
    """

    def __init__(self, max_size: int, *, device: torch.device | str = "cpu") -> None:
        super().__init__(max_size, device)

    def share(self) -> None:
        """Moves the leaves and the commit log to shared memory files owned by this process.

        Raises:
            ValueError: the storage is not on the CPU.
        """
        if self._directory is not None:
            return
        if self.device.type != "cpu":
            raise ValueError(
                f"a shared storage lives in CPU shared memory, but this one is on {self.device}; "
                "use device='cpu' and move samples to the accelerator after sampling."
            )
        path = tempfile.mkdtemp(prefix=f"rlcollect-rb-{os.getpid()}-", dir=shared_memory_root())
        self._cleanup = weakref.finalize(self, remove_directory, path, os.getpid())
        state = self.state_dict()
        self._set_leaves(None, None)
        self._use_directory(StorageDirectory(path, self.max_size))
        self.load_state_dict(state)

    def close(self) -> None:
        """Removes the shared memory files (in the process that created them)."""
        cleanup = getattr(self, "_cleanup", None)
        if cleanup is not None:
            cleanup()

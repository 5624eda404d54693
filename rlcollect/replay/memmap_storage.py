"""LazyMemmapStorage: frames in memory-mapped files that survive the process and reopen."""

from __future__ import annotations

import os
import tempfile
import weakref
from pathlib import Path

import torch

from rlcollect.replay.storage_directory import StorageDirectory, remove_directory
from rlcollect.replay.tensor_storage import TensorStorage


class LazyMemmapStorage(TensorStorage):
    """A storage of TensorDicts (or tensors) in memory-mapped files, allocated from the first write.

    Every leaf is a ``[max_size, *shape]`` file in ``scratch_dir``; the cursor, length and write
    count live in a small mapped commit log next to them. Writes follow a commit protocol: the
    slots about to change are marked, the data is written, and only then is the new cursor and
    length published with one atomic store. A writer killed at any point (even by SIGKILL) leaves
    a directory that reopens with every completed ``extend`` intact and without any half-written
    item in its valid window. Any number of processes can open the same directory; they exclude
    each other with a lock file.

    Args:
        max_size: the number of frames it holds; older frames are overwritten past it.

    Keyword Args:
        scratch_dir: the directory of the files. A directory that already holds a storage of the
            same ``max_size`` is reopened with its data. ``None`` makes a temporary directory,
            removed when this storage is garbage collected or closed.
        device: where sampled frames are returned. Defaults to ``"cpu"``.
        durable: also force each write to the disk (``msync``) before publishing it, so a machine
            crash keeps committed writes too. Process crashes never need it. Defaults to False.

    Examples:
        >>> import tempfile, torch
        >>> from tensordict import TensorDict
        >>> from rlcollect.replay import LazyMemmapStorage, ReplayBuffer
        >>> with tempfile.TemporaryDirectory() as path:
        ...     rb = ReplayBuffer(storage=LazyMemmapStorage(1000, scratch_dir=path))
        ...     _ = rb.extend(TensorDict({"observation": torch.ones(10, 4)}, [10]))
        ...     reopened = ReplayBuffer(storage=LazyMemmapStorage.open(path))
        ...     len(reopened), reopened.write_count
        (10, 10)
    """

    def __init__(
        self,
        max_size: int,
        *,
        scratch_dir: str | Path | None = None,
        device: torch.device | str = "cpu",
        durable: bool = False,
    ) -> None:
        super().__init__(max_size, device)
        self._durable = durable
        if scratch_dir is None:
            scratch_dir = tempfile.mkdtemp(prefix="rlcollect-memmap-")
            self._cleanup = weakref.finalize(self, remove_directory, scratch_dir, os.getpid())
        self._use_directory(StorageDirectory(scratch_dir, self.max_size))
        with self.lock:
            pass  # maps existing leaves and repairs an interrupted write

    @classmethod
    def open(
        cls, scratch_dir: str | Path, *, device: torch.device | str = "cpu", durable: bool = False
    ) -> LazyMemmapStorage:
        """Reopens the storage saved in ``scratch_dir``, with its own ``max_size``.

        Raises:
            FileNotFoundError: the directory holds no storage.
        """
        max_size = StorageDirectory(scratch_dir, None).max_size
        return cls(max_size, scratch_dir=scratch_dir, device=device, durable=durable)

    @property
    def scratch_dir(self) -> Path:
        """The directory of the files."""
        return self._directory.path  # type: ignore[union-attr]

    def share(self) -> None:
        """Nothing to do: the files are already shared by every process that opens them."""

    def close(self) -> None:
        """Removes a temporary directory (made when no ``scratch_dir`` was given)."""
        cleanup = getattr(self, "_cleanup", None)
        if cleanup is not None:
            cleanup()

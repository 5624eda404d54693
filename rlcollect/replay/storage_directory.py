"""The files of a tensor storage on disk or in shared memory: size, layout, log and leaves."""

from __future__ import annotations

import json
import mmap
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlcollect.replay.commit_log import NUM_CELLS
from rlcollect.replay.layout import FrameLayout
from rlcollect.replay.storage_lock import StorageLock
from rlcollect.replay.tallies import NUM_COLUMNS, TALLY_SLOTS, Tallies

STORAGE_FILE = "storage.json"
LAYOUT_FILE = "layout.json"
CONTROL_FILE = "control.bin"
TALLIES_FILE = "tallies.bin"
LOCK_FILE = "lock"
FORMAT = "rlcollect-tensor-storage"


def shared_memory_root() -> Path:
    """Where shared-memory files go: ``/dev/shm`` when it exists, else the temp directory."""
    root = Path("/dev/shm")
    if root.is_dir() and os.access(root, os.W_OK):
        return root
    return Path(tempfile.gettempdir())


def write_atomically(path: Path, payload: bytes) -> None:
    """Writes ``payload`` to ``path`` so that readers see either nothing or all of it."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(payload)
    os.replace(temporary, path)


def map_file(path: Path, dtype: torch.dtype, shape: tuple[int, ...]) -> tuple[torch.Tensor, Any]:
    """Maps an existing file as a writable tensor; returns the tensor and its ``mmap`` (or None)."""
    numel = int(np.prod(shape))
    if numel == 0:
        return torch.zeros(shape, dtype=dtype), None
    size = numel * dtype.itemsize
    descriptor = os.open(path, os.O_RDWR)
    try:
        mapping = mmap.mmap(descriptor, size)
    finally:
        os.close(descriptor)
    return torch.frombuffer(mapping, dtype=dtype, count=numel).view(shape), mapping


class StorageDirectory:
    """A directory holding one tensor storage, opened (or created) by any number of processes.

    Files: ``storage.json`` (format and ``max_size``, written last when creating), ``control.bin``
    (the commit log cells), ``tallies.bin`` (the writers' tallies, see
    :class:`~rlcollect.replay.tallies.Tallies`), ``lock`` (the inter-process lock), and, once
    the first batch fixed the frame layout, one ``leaf-<i>.bin`` per leaf and ``layout.json``
    (written after the leaf files, so its presence means they are complete).

    Args:
        path: the directory; created when missing.
        max_size: the number of slots; ``None`` to open an existing storage with its own size.

    Raises:
        ValueError: the directory holds a storage of another size.
        FileNotFoundError: ``max_size`` is None and the directory holds no storage.

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as path:
        ...     StorageDirectory(path, max_size=8).max_size
        8
    """

    def __init__(self, path: str | Path, max_size: int | None) -> None:
        self.path = Path(path).absolute()
        if max_size is None and not (self.path / STORAGE_FILE).exists():
            raise FileNotFoundError(f"{self.path} holds no storage (no {STORAGE_FILE}).")
        self.path.mkdir(parents=True, exist_ok=True)
        self.lock = StorageLock(str(self.path / LOCK_FILE))
        with self.lock:
            self.max_size = self._create_or_check(max_size)
            if not (self.path / TALLIES_FILE).exists():  # made before tallies existed
                write_atomically(self.path / TALLIES_FILE, bytes(TALLY_SLOTS * NUM_COLUMNS * 8))
        cells, self._control_map = map_file(self.path / CONTROL_FILE, torch.int64, (NUM_CELLS,))
        self.cells = cells.numpy()
        tallies, self._tallies_map = map_file(
            self.path / TALLIES_FILE, torch.int64, (TALLY_SLOTS, NUM_COLUMNS)
        )
        self.tallies = Tallies(tallies.numpy())
        self._leaf_maps: list[Any] = []

    def _create_or_check(self, max_size: int | None) -> int:
        description = self.path / STORAGE_FILE
        if description.exists():
            saved = json.loads(description.read_text())
            if saved.get("format") != FORMAT:
                raise ValueError(f"{self.path} does not hold an rlcollect tensor storage.")
            if max_size is not None and saved["max_size"] != max_size:
                raise ValueError(
                    f"{self.path} holds a storage of max_size={saved['max_size']}, not "
                    f"max_size={max_size}; pass max_size={saved['max_size']} to reopen it, or "
                    "use another directory."
                )
            return int(saved["max_size"])
        if max_size is None:  # removed since the check in __init__
            raise FileNotFoundError(f"{self.path} holds no storage (no {STORAGE_FILE}).")
        write_atomically(self.path / CONTROL_FILE, bytes(NUM_CELLS * 8))
        text = json.dumps({"format": FORMAT, "version": 1, "max_size": max_size})
        write_atomically(description, text.encode())
        return max_size

    def read_layout(self) -> FrameLayout | None:
        """The frame layout, or None while no batch was written."""
        try:
            text = (self.path / LAYOUT_FILE).read_text()
        except FileNotFoundError:
            return None
        return FrameLayout.from_json(json.loads(text))

    def allocate(self, layout: FrameLayout) -> None:
        """Creates the zero-filled leaf files, then publishes the layout (hold the lock)."""
        for position, leaf in enumerate(layout.leaves):
            with open(self._leaf_path(position), "wb") as handle:
                handle.truncate(self.max_size * leaf.numel * leaf.dtype.itemsize)
        write_atomically(self.path / LAYOUT_FILE, json.dumps(layout.to_json()).encode())

    def map_leaves(self, layout: FrameLayout) -> list[torch.Tensor]:
        """Maps every leaf file as a ``[max_size, *shape]`` tensor."""
        leaves = []
        self._leaf_maps = []
        for position, leaf in enumerate(layout.leaves):
            shape = (self.max_size, *leaf.shape)
            tensor, mapping = map_file(self._leaf_path(position), leaf.dtype, shape)
            leaves.append(tensor)
            self._leaf_maps.append((mapping, leaf.numel * leaf.dtype.itemsize))
        return leaves

    def flush(self, start: int, count: int) -> None:
        """Forces slots ``start .. start + count - 1`` (no wrap) of every leaf to the disk."""
        for mapping, frame_bytes in self._leaf_maps:
            if mapping is None:
                continue
            begin = start * frame_bytes // mmap.PAGESIZE * mmap.PAGESIZE
            end = (start + count) * frame_bytes
            mapping.flush(begin, end - begin)

    def _leaf_path(self, position: int) -> Path:
        return self.path / f"leaf-{position:03d}.bin"

    def remove(self) -> None:
        """Deletes the directory and every file in it."""
        self.lock.close()
        shutil.rmtree(self.path, ignore_errors=True)


def remove_directory(path: str, owner_pid: int) -> None:
    """Deletes ``path`` when called in ``owner_pid`` (a finalizer that forked children skip)."""
    if os.getpid() == owner_pid:
        shutil.rmtree(path, ignore_errors=True)

"""Writers decide which storage slots a batch goes to: the Writer contract and RoundRobinWriter."""

from __future__ import annotations

import abc
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rlcollect.errors import MisuseError
from rlcollect.replay.storage import Frames, Storage


class Writer(abc.ABC):
    """Places batches into the slots of a storage.

    Contract: :meth:`extend` runs while the caller holds ``storage.lock``. It brackets every
    ``storage.write`` with ``storage.log.begin`` and ``storage.log.commit`` (so a crash in between
    never exposes a half-written slot), and returns the slot of every frame as a 1-D long tensor,
    in the order of the frames. Frames counted in writer tallies (``tally_slots``) are counted by
    the same commit (``log.begin(count, tally_slots, frames)``).

    Examples:
        >>> from rlcollect.replay import ListStorage
        >>> writer = RoundRobinWriter()
        >>> writer.register_storage(ListStorage(2))
        >>> with writer.storage.lock:
        ...     writer.extend(writer.storage.prepare(["a", "b", "c"], batch_dims=1))
        tensor([0, 1, 0])
        >>> writer.state_dict()
        {'cursor': 1, 'write_count': 3}
    """

    _storage: Storage | None = None

    def register_storage(self, storage: Storage) -> None:
        """Binds the writer to the storage it writes to."""
        self._storage = storage

    @property
    def storage(self) -> Storage:
        """The storage this writer writes to.

        Raises:
            MisuseError: no storage was registered.
        """
        if self._storage is None:
            raise MisuseError(
                f"this {type(self).__name__} has no storage; pass it to a ReplayBuffer (or call "
                "register_storage) first."
            )
        return self._storage

    @abc.abstractmethod
    def extend(self, frames: Frames, tally_slots: Sequence[int] = ()) -> torch.Tensor:
        """Writes ``frames`` and returns their slots; with ``tally_slots``, the same commit adds
        the number of frames to each of those writer tallies."""

    def state_dict(self) -> dict[str, Any]:
        """The writer's position, as a picklable dict."""
        log = self.storage.log
        return {"cursor": log.cursor, "write_count": log.write_count}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned."""
        storage = self.storage
        with storage.lock:
            storage.log.reset(state_dict["cursor"], storage.log.length, state_dict["write_count"])

    def dumps(self, path: str | Path) -> None:
        """Saves the writer's position into the directory ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "writer.json").write_text(json.dumps(self.state_dict()))

    def loads(self, path: str | Path) -> None:
        """Restores a position saved with :meth:`dumps`."""
        self.load_state_dict(json.loads((Path(path) / "writer.json").read_text()))


class RoundRobinWriter(Writer):
    """Writes batches at the cursor and moves it on, overwriting the oldest items once full.

    The cursor and the write count live in the storage's commit log, so every process writing
    to a shared storage takes the next free slots in turn: concurrent writers get disjoint slots
    and the write count stays exact. A batch larger than the storage keeps its last ``max_size``
    frames (the returned indices still cover every frame).

    Examples:
        >>> import torch
        >>> from rlcollect.replay import LazyTensorStorage, ReplayBuffer, RoundRobinWriter
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(4), writer=RoundRobinWriter())
        >>> rb.extend(torch.arange(3))
        tensor([0, 1, 2])
        >>> rb.extend(torch.arange(3))
        tensor([3, 0, 1])
        >>> rb.write_count, len(rb)
        (6, 4)
    """

    def extend(self, frames: Frames, tally_slots: Sequence[int] = ()) -> torch.Tensor:
        storage = self.storage
        log = storage.log
        capacity = storage.max_size
        cursor, length, write_count = log.snapshot()
        count = frames.num_frames
        kept = min(count, capacity)
        log.begin(kept, tally_slots, count)
        try:
            storage.write((cursor + count - kept) % capacity, frames.tail(kept))
        except BaseException:
            # Keep the torn slots out of the valid window, then report the failure.
            log.recover(capacity)
            raise
        log.commit((cursor + count) % capacity, min(length + count, capacity), write_count + count)
        index = torch.arange(cursor, cursor + count)
        if cursor + count > capacity:
            index.remainder_(capacity)
        return index

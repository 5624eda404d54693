"""What each worker wrote to a shared replay buffer, counted by the write's own commit.

A worker's `extend` and its count are one transaction: the buffer's writer tallies (see
`rlcollect.replay.tallies`) move with the commit, so a worker killed inside `extend` leaves
neither the batch nor its count, and one killed right after the commit leaves both. A buffer
without tallies (any object with `extend()`) is counted after its write, in shared memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch


def has_tallies(buffer: Any) -> bool:
    """Whether `buffer` counts writes in its commit (a `ReplayBuffer`, or a worker's view)."""
    return callable(getattr(buffer, "claim_tallies", None))


class CountingBuffer:
    """A worker's view of the shared replay buffer: every `extend` also counts its frames in
    the worker's tally (in the write's commit), or in its slot of a shared counter.

    A worker that is itself a multi-process collector hands its own workers a view of this
    view: their writes count in both tallies, in one commit.
    """

    def __init__(
        self, buffer: Any, index: int, tally: int | None, counts: torch.Tensor | None
    ) -> None:
        self.buffer = buffer
        self.index = index
        self.tally = tally
        self.counts = counts

    def extend(self, data: Any, *, tally_slots: Sequence[int] = ()) -> Any:
        if self.tally is not None:
            return self.buffer.extend(data, tally_slots=(self.tally, *tally_slots))
        written = self.buffer.extend(data)
        if self.counts is not None:
            self.counts[self.index] += data.numel()
        return written

    def add(self, data: Any) -> Any:
        """One item (TorchRL's `add`: one step of a batched env with `extend_buffer=False`),
        counted as its frames."""
        if self.tally is not None:  # ours: `add` is a one-item extend, counted in its commit
            return self.extend(data.unsqueeze(0))
        written = self.buffer.add(data)
        if self.counts is not None:
            self.counts[self.index] += max(data.numel(), 1)
        return written

    def __getattr__(self, name: str) -> Any:
        if name in ("claim_tallies", "read_tallies", "release_tallies") and self.tally is None:
            raise AttributeError(name)  # counted after the write: no tallies to share
        return getattr(self.buffer, name)

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


class WriteLedger:
    """The frames each worker of a collector committed to its replay buffer.

    Args:
        buffer: the shared replay buffer (or a parent worker's view of it), or None.
        num_workers: one count per worker.
    """

    def __init__(self, buffer: Any, num_workers: int) -> None:
        self.buffer = buffer
        self.num_workers = num_workers
        self.slots: list[int] | None = None
        self.counts: torch.Tensor | None = None
        self.final: list[int] | None = None  # what was written when the tallies went back
        if buffer is None:
            return
        if has_tallies(buffer):
            self.slots = buffer.claim_tallies(num_workers)
        else:
            self.counts = torch.zeros(num_workers, dtype=torch.int64).share_memory_()

    def view(self, index: int) -> CountingBuffer | None:
        """What worker `index` writes through (None without a buffer)."""
        if self.buffer is None:
            return None
        tally = None if self.slots is None else self.slots[index]
        return CountingBuffer(self.buffer, index, tally, self.counts)

    def written(self) -> list[int]:
        """Frames each worker committed, after repairing a killed worker's write."""
        if self.final is not None:
            return list(self.final)
        if self.slots is not None:
            try:
                return list(self.buffer.read_tallies(self.slots))
            except OSError:  # the buffer was closed first: its tallies are still mapped here
                return list(self.buffer.storage.log.tallies.read(self.slots))
        if self.counts is not None:
            return [int(count) for count in self.counts]
        return [0] * self.num_workers

    def total(self) -> int:
        return sum(self.written())

    def release(self) -> None:
        """Give the tallies back to the buffer (idempotent)."""
        if self.slots is None or self.final is not None:
            return
        self.final = self.written()
        with contextlib.suppress(OSError):  # the buffer was closed first
            self.buffer.release_tallies(self.slots)

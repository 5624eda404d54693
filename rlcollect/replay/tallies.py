"""Per-writer frame tallies committed with a storage's writes, so a count never disagrees with
the data it counts, even when the writer is killed halfway through an ``extend``."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from rlcollect.errors import MisuseError

# A storage keeps this many tallies; a multi-process collector claims one per worker (and a
# worker that is itself a multi-process collector one per worker of its own).
TALLY_SLOTS = 1024
# Columns of the [TALLY_SLOTS, 3] int64 array: the claiming process (0: free), the frames
# committed, and the frames the transaction in flight will have committed (== COMMITTED at rest).
OWNER, COMMITTED, TARGET = 0, 1, 2
NUM_COLUMNS = 3


def process_exists(pid: int) -> bool:
    """Whether a process of id `pid` exists (a zombie counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Tallies:
    """Frames written per claimed slot, advanced only by the commit of the write they count.

    A write counted in tallies stages its slots (``TARGET = COMMITTED + frames``) before the
    storage's commit log marks the transaction; the commit rolls the staged slots forward, and
    the recovery of a killed writer rolls them forward when its commit was published, back when
    it was not. Both moves are idempotent, so a recovery that is itself interrupted is simply
    done again by the next holder of the storage's lock. Every method runs under that lock.

    Args:
        cells: an int64 array of shape ``[TALLY_SLOTS, 3]``, zero for fresh tallies; in shared
            memory or a mapped file when several processes use the storage.

    Examples:
        >>> tallies = Tallies(np.zeros((TALLY_SLOTS, NUM_COLUMNS), dtype=np.int64))
        >>> slots = tallies.claim(2)
        >>> tallies.stage(slots[:1], 10)
        >>> tallies.read(slots)  # staged, not committed
        [0, 0]
        >>> tallies.settle(committed=True)
        >>> tallies.read(slots)
        [10, 0]
    """

    def __init__(self, cells: np.ndarray) -> None:
        if cells.dtype != np.int64 or cells.shape != (TALLY_SLOTS, NUM_COLUMNS):
            raise ValueError(
                f"expected int64 cells of shape ({TALLY_SLOTS}, {NUM_COLUMNS}), got "
                f"{cells.dtype} {cells.shape}"
            )
        self.cells = cells

    def claim(self, count: int) -> list[int]:
        """`count` free slots (or slots whose claiming process is gone), zeroed and owned by
        this process.

        Raises:
            MisuseError: fewer than `count` slots are free.
        """
        owners = self.cells[:, OWNER]
        free = [
            int(slot)
            for slot in np.flatnonzero(owners == 0).tolist()
            + [s for s in np.flatnonzero(owners != 0).tolist() if not process_exists(owners[s])]
        ][:count]
        if len(free) < count:
            raise MisuseError(
                f"the storage has {len(free)} free write tallies but {count} were asked for "
                f"(it keeps {TALLY_SLOTS}); shut down collectors that write to it first."
            )
        for slot in free:
            self.cells[slot, COMMITTED] = 0
            self.cells[slot, TARGET] = 0
            self.cells[slot, OWNER] = os.getpid()
        return free

    def release(self, slots: Sequence[int]) -> None:
        """Frees `slots` (those this process claimed)."""
        for slot in slots:
            if int(self.cells[slot, OWNER]) == os.getpid():
                self.cells[slot, OWNER] = 0

    def read(self, slots: Sequence[int]) -> list[int]:
        """The frames committed in each of `slots`."""
        return [int(self.cells[slot, COMMITTED]) for slot in slots]

    def stage(self, slots: Sequence[int], frames: int) -> None:
        """Marks `frames` as about to be committed in each of `slots`."""
        for slot in slots:
            self.cells[slot, TARGET] = int(self.cells[slot, COMMITTED]) + frames

    def settle(self, committed: bool) -> None:
        """Rolls every staged slot forward (`committed`) or back."""
        staged = np.flatnonzero(self.cells[:, TARGET] != self.cells[:, COMMITTED])
        for slot in staged.tolist():
            if committed:
                self.cells[slot, COMMITTED] = self.cells[slot, TARGET]
            else:
                self.cells[slot, TARGET] = self.cells[slot, COMMITTED]


def fresh_tallies() -> Tallies:
    """Tallies in this process's memory (for storages no other process writes)."""
    return Tallies(np.zeros((TALLY_SLOTS, NUM_COLUMNS), dtype=np.int64))

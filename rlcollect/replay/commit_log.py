"""The cursor, length and write count of a storage, published after the data (a commit marker)."""

from __future__ import annotations

import numpy as np

# Cell positions in the int64 array. Two records alternate; ``EPOCH % 2`` names the live one, so a
# commit becomes visible with one aligned 8-byte store, which a killed process cannot tear.
EPOCH = 0
PENDING_EPOCH = 1
PENDING_COUNT = 2
RECORDS = (4, 8)
CURSOR, LENGTH, WRITE_COUNT = 0, 1, 2
NUM_CELLS = 16


class CommitLog:
    """The committed state of a circular storage: where the next write goes, how many slots hold
    data, and how many items were ever written.

    A write runs as a transaction, under the storage's lock:

    1. :meth:`begin` records that ``count`` slots from the cursor are about to change;
    2. the data is written into those slots;
    3. :meth:`commit` publishes the new cursor, length and write count in one atomic step.

    A process killed between 1 and 3 leaves the pending mark behind; the next process to take the
    lock calls :meth:`recover`, which drops from the valid window every slot the dead writer may
    have torn. Readers therefore only ever see committed slots. The valid window is the ``length``
    slots that end just before the cursor.

    Args:
        cells: an int64 array of :data:`NUM_CELLS` cells, zero for an empty storage; in shared
            memory or a mapped file when several processes use the storage.

    Examples:
        >>> import numpy as np
        >>> log = CommitLog(np.zeros(NUM_CELLS, dtype=np.int64))
        >>> log.begin(3)
        >>> log.commit(cursor=3, length=3, write_count=3)
        >>> log.cursor, log.length, log.write_count, log.window_start(capacity=10)
        (3, 3, 3, 0)
    """

    def __init__(self, cells: np.ndarray) -> None:
        if cells.dtype != np.int64 or cells.shape != (NUM_CELLS,):
            raise ValueError(
                f"expected int64 cells of shape ({NUM_CELLS},), got {cells.dtype} {cells.shape}"
            )
        self.cells = cells

    def _record(self) -> int:
        return RECORDS[int(self.cells[EPOCH]) % 2]

    @property
    def cursor(self) -> int:
        """The slot the next write starts at."""
        return int(self.cells[self._record() + CURSOR])

    @property
    def length(self) -> int:
        """The number of slots that hold committed data."""
        return int(self.cells[self._record() + LENGTH])

    @property
    def write_count(self) -> int:
        """The number of items ever committed (not reduced by overwrites)."""
        return int(self.cells[self._record() + WRITE_COUNT])

    @property
    def pending(self) -> int:
        """The number of slots an unfinished transaction may have changed (0 when none)."""
        return int(self.cells[PENDING_COUNT])

    def snapshot(self) -> tuple[int, int, int]:
        """``(cursor, length, write_count)`` read from one record."""
        base = self._record()
        return (
            int(self.cells[base + CURSOR]),
            int(self.cells[base + LENGTH]),
            int(self.cells[base + WRITE_COUNT]),
        )

    def window_start(self, capacity: int) -> int:
        """The slot of the oldest committed item."""
        cursor, length, _ = self.snapshot()
        return (cursor - length) % capacity

    def begin(self, count: int) -> None:
        """Marks ``count`` slots from the cursor as being rewritten."""
        self.cells[PENDING_EPOCH] = int(self.cells[EPOCH]) + 1
        self.cells[PENDING_COUNT] = count

    def commit(self, cursor: int, length: int, write_count: int) -> None:
        """Publishes a new state: fill the idle record, flip the epoch, clear the pending mark."""
        epoch = int(self.cells[EPOCH]) + 1
        base = RECORDS[epoch % 2]
        self.cells[base + CURSOR] = cursor
        self.cells[base + LENGTH] = length
        self.cells[base + WRITE_COUNT] = write_count
        self.cells[EPOCH] = epoch
        self.cells[PENDING_COUNT] = 0

    def recover(self, capacity: int) -> int:
        """Drops the slots of an unfinished transaction from the valid window.

        Returns:
            The number of committed items removed from the window because they may be torn.
        """
        pending = self.pending
        if pending == 0:
            return 0
        if int(self.cells[PENDING_EPOCH]) == int(self.cells[EPOCH]):
            # The epoch flipped: the commit is complete, only the mark was left behind.
            self.cells[PENDING_COUNT] = 0
            return 0
        cursor, length, write_count = self.snapshot()
        kept = min(length, capacity - pending)
        self.commit(cursor, kept, write_count)
        return length - kept

    def reset(self, cursor: int = 0, length: int = 0, write_count: int = 0) -> None:
        """Overwrites the state (used by ``empty`` and ``load_state_dict``)."""
        self.commit(cursor, length, write_count)

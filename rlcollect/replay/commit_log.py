"""The cursor, length and write count of a storage, published after the data (a commit marker)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlcollect.replay.tallies import Tallies, fresh_tallies

# Cell positions in the int64 array. Two records alternate; ``EPOCH % 2`` names the live one, so a
# commit becomes visible with one aligned 8-byte store, which a killed process cannot tear.
EPOCH = 0
PENDING_EPOCH = 1
PENDING_COUNT = 2
TALLIES_STAGED = 3  # 1 while a transaction's tallies are staged (see `Tallies`)
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

    A transaction may also count its frames in writer tallies (:class:`Tallies`): they move
    with the commit, so a tally never counts a write the storage dropped, nor misses one it kept.

    Args:
        cells: an int64 array of :data:`NUM_CELLS` cells, zero for an empty storage; in shared
            memory or a mapped file when several processes use the storage.
        tallies: the storage's writer tallies (next to `cells`); private ones when None.

    Examples:
        >>> import numpy as np
        >>> log = CommitLog(np.zeros(NUM_CELLS, dtype=np.int64))
        >>> log.begin(3)
        >>> log.commit(cursor=3, length=3, write_count=3)
        >>> log.cursor, log.length, log.write_count, log.window_start(capacity=10)
        (3, 3, 3, 0)
    """

    def __init__(self, cells: np.ndarray, tallies: Tallies | None = None) -> None:
        if cells.dtype != np.int64 or cells.shape != (NUM_CELLS,):
            raise ValueError(
                f"expected int64 cells of shape ({NUM_CELLS},), got {cells.dtype} {cells.shape}"
            )
        self.cells = cells
        self.tallies = tallies if tallies is not None else fresh_tallies()

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

    def begin(self, count: int, tally_slots: Sequence[int] = (), frames: int = 0) -> None:
        """Marks ``count`` slots from the cursor as being rewritten, and ``frames`` as about to
        be counted in each tally of ``tally_slots``."""
        if tally_slots:
            self.cells[TALLIES_STAGED] = 1
            self.tallies.stage(tally_slots, frames)
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
        if self.cells[TALLIES_STAGED]:
            self.tallies.settle(committed=True)
            self.cells[TALLIES_STAGED] = 0
        self.cells[PENDING_COUNT] = 0

    def recover(self, capacity: int) -> int:
        """Drops the slots of an unfinished transaction from the valid window.

        Staged tallies move with the transaction: forward when its commit was published, back
        when it was not.

        Returns:
            The number of committed items removed from the window because they may be torn.
        """
        pending = self.pending
        if self.cells[TALLIES_STAGED]:
            published = pending != 0 and int(self.cells[PENDING_EPOCH]) == int(self.cells[EPOCH])
            self.tallies.settle(committed=published)
            self.cells[TALLIES_STAGED] = 0
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

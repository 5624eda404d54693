"""Real parts that fail on purpose, for the chaos tests: a writer that kills its own process
inside `extend`, and the counting env the soak uses (imported by worker processes)."""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from pathlib import Path

import torch

from rlcollect.replay import RoundRobinWriter
from rlcollect.replay.storage import Frames
from rlcollect.testing import CountingEnv

# Where in `extend` the writer kills its process.
BEFORE_COMMIT = "before_commit"  # every slot written, the commit not published
MID_WRITE = "mid_write"  # half of the slots written
AFTER_COMMIT = "after_commit"  # the commit published, `extend` not returned


def counting_env() -> CountingEnv:
    return CountingEnv(episode_length=7)


class DieInExtendWriter(RoundRobinWriter):
    """A round-robin writer whose `after`-th `extend` in a worker process SIGKILLs it at
    `where`, once over all processes (the first to create `marker` dies; it records there
    the write count it saw and the frames it was writing)."""

    def __init__(self, where: str, marker: Path, after: int = 2) -> None:
        self.where = where
        self.marker = str(marker)
        self.after = after
        self.calls = 0

    def extend(self, frames: Frames, tally_slots: Sequence[int] = ()) -> torch.Tensor:
        self.calls += 1
        if self.calls < self.after or not self._chosen():
            return super().extend(frames, tally_slots)
        storage, log = self.storage, self.storage.log
        capacity = storage.max_size
        cursor, length, write_count = log.snapshot()
        count = frames.num_frames
        Path(self.marker).write_text(f"{write_count} {count}")
        log.begin(count, tally_slots, count)
        if self.where == MID_WRITE:
            storage.write(cursor, frames.tail(count // 2))
        else:
            storage.write(cursor, frames)
        if self.where == AFTER_COMMIT:
            log.commit(
                (cursor + count) % capacity, min(length + count, capacity), write_count + count
            )
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable: the process was killed")

    def _chosen(self) -> bool:
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

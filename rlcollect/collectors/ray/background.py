"""`BackgroundWriting`: a RayCollector's actors filling a Ray-served replay buffer on their own.

Each actor writes its share of the frames left (whole batches) in a thread of its own; this side
only sets the shares, pauses and stops them, and counts what they wrote by asking them. Asking
also reports an actor whose background collection failed, and has a dead one restarted (by the
fleet), after which it goes on with what is left of its share.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rlcollect.collectors.ray.fleet import ActorError, ActorFleet, ActorSlot
from rlcollect.errors import MisuseError


class BackgroundWriting:
    """The background writes of the `count` actors of `fleet`: shares, progress, pauses and
    restarts."""

    def __init__(self, fleet: ActorFleet, count: int) -> None:
        self.fleet = fleet
        self.active = False
        self.pauses = 0
        self.shares = [0] * count  # frames each actor writes (0: no limit)
        self.written = [0] * count  # ... written by its current process, since start()
        self.written_before = [0] * count  # ... written by its processes that died

    @property
    def is_busy(self) -> bool:
        """Whether the actors may be writing now: started, and not held by `pause()`."""
        return self.active and not self.pauses

    def start(self, left: int) -> None:
        """Every actor writes its share of `left` frames (0: until stopped), in proportion to
        its batch and in whole batches."""
        if self.active:
            raise MisuseError("start() was already called; the actors are filling the buffer.")
        every = sum(slot.frames_per_batch for slot in self.fleet.slots)
        calls = []
        for slot in self.fleet.slots:
            share = -(-left * slot.frames_per_batch // every)
            share = -(-share // slot.frames_per_batch) * slot.frames_per_batch
            self.shares[slot.index] = share
            calls.append(self.fleet.submit(slot, "start", share))
        self.written = [0] * len(self.shares)
        self.written_before = [0] * len(self.shares)
        self.active = True
        self.fleet.gather(calls)

    def frames_written(self) -> int:
        """Frames the actors wrote since `start()`, as they report it now.

        Raises:
            ActorError: an actor's background collection failed (with its traceback); every
                actor is ended first.
        """
        progress = self.fleet.call(self.fleet.slots, "progress")
        for slot, (written, failure) in zip(self.fleet.slots, progress, strict=True):
            if failure is not None:
                reason = f"background collection raised {failure.strip().splitlines()[-1]}"
                self.fleet.fail(ActorError(slot.index, reason, failure))
            self.written[slot.index] = written
        return sum(self.written) + sum(self.written_before)

    @contextmanager
    def pause(self) -> Iterator[None]:
        """No actor collects or writes while the block runs (pauses nest)."""
        if not self.pauses and self.active:
            self.fleet.call(self.fleet.slots, "pause")
        self.pauses += 1
        try:
            yield
        finally:
            self.pauses -= 1
            if not self.pauses and self.active and self.fleet.is_open:
                self.fleet.call(self.fleet.slots, "resume")

    def stop(self, timeout: float | None = None) -> int:
        """End the background writes (each actor writes the batch it is on); returns the frames
        written since `start()`."""
        written = self.fleet.call(self.fleet.slots, "stop", timeout=timeout)
        self.active = False
        for slot, frames in zip(self.fleet.slots, written, strict=True):
            slot.counted += frames
        return sum(written) + sum(self.written_before)

    def reported(self, slot: ActorSlot) -> int:
        """Frames the current process of `slot` reported writing since `start()` (0 when not
        writing in the background)."""
        return self.written[slot.index] if self.active else 0

    def abandon(self) -> int:
        """End the background writes of actors that are already gone; returns the frames
        they reported since `start()` (0 if they were not writing)."""
        if not self.active:
            return 0
        self.active = False
        return sum(self.written) + sum(self.written_before)

    def resume(self, slot: ActorSlot, unreported: int) -> None:
        """A restarted actor goes on with what is left of its share (its dead process wrote
        `unreported` frames more than it reported)."""
        if not self.active:
            return
        index = slot.index
        self.written_before[index] += self.written[index] + unreported
        self.written[index] = 0
        share = self.shares[index]
        left = max(0, share - self.written_before[index]) if share else 0
        if left or not share:
            self.fleet.call([slot], "start", left)

"""A learner beside a background collector: update pacing, throttle, stall watch, returns."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tensordict import TensorDictBase

from rlcollect import keys


def next_row_at(frames: int, every: int) -> int:
    """The first point of the `every`-frame logging grid past `frames`. A background collector
    may have added a batch before the learner first reads its count; reading it off the grid
    (rather than `frames + every`) puts the rows at the same frames whatever that timing.

    Examples:
        >>> next_row_at(0, 200), next_row_at(50, 200), next_row_at(800, 200)
        (200, 200, 1000)
    """
    return (frames // every + 1) * every


class UpdatePacer:
    """Keeps `updates_per_frame` gradient steps per collected frame (the update-to-data ratio)
    from the moment the buffer holds `learning_starts` items (after a resume too, once the
    buffer has refilled).

    Examples:
        >>> pacer = UpdatePacer(updates_per_frame=0.5, learning_starts=100)
        >>> pacer.lag(frames=50, updates=0, buffer_size=50)  # still filling the buffer
        0
        >>> pacer.lag(frames=200, updates=0, buffer_size=200)  # 100 frames past the start
        50
    """

    def __init__(self, updates_per_frame: float, learning_starts: int) -> None:
        self.updates_per_frame = updates_per_frame
        self.learning_starts = learning_starts
        self.anchor: tuple[int, int] | None = None

    def lag(self, frames: int, updates: int, buffer_size: int) -> int:
        """How many gradient steps the learner owes at `frames` frames."""
        if self.anchor is None:
            if buffer_size < self.learning_starts:
                return 0
            # The buffer grows one item per frame until the learner first looks: anchor at the
            # frame where it crossed `learning_starts`, however late the learner noticed.
            self.anchor = (frames - (buffer_size - self.learning_starts), updates)
        anchor_frames, anchor_updates = self.anchor
        # the small epsilon keeps e.g. 300 frames * (1/3) from rounding down to 99 steps
        owed = int((frames - anchor_frames) * self.updates_per_frame + 1e-9)
        return anchor_updates + owed - updates


class CollectionThrottle:
    """Keeps a background collector at most `frames_ahead` frames ahead of the learner, as
    the collector's `pre_collect_hook`: before each batch, the collector's thread publishes
    the frames counted so far and the size of the replay buffer (`stored`: every batch before
    this one is written, so the two agree) and waits until its frame count is below the
    limit the learner last set with `allow`.

    Without it a collector that steps faster than the learner trains runs through its whole
    budget on an early policy, and the learner then trains on data it never acted on. With
    `frames_ahead` at most one batch, collection and learning take turns (the learner
    pushes its weights before `allow`, so a seed gives the same run). `open()` lifts
    the limit (before `collector.pause()`, which waits for the batch in flight, and before
    shutting the collector down).
    """

    def __init__(self, frames_ahead: int) -> None:
        self.frames_ahead = frames_ahead
        self.collector: Any = None
        self.replay_buffer: Any = None
        self.stored = (0, 0)  # (frames, buffer size) before the batch the collector is at
        self._limit = math.inf
        self._condition = threading.Condition()

    def watch(self, collector: Any, replay_buffer: Any) -> None:
        """Throttle `collector` (the one this hook was given to), which fills
        `replay_buffer`, from its frames now."""
        with self._condition:
            self.collector, self.replay_buffer = collector, replay_buffer
            self.stored = (collector.frames, len(replay_buffer))
            self._limit = collector.frames + self.frames_ahead

    def allow(self, learned_frames: int) -> None:
        """The learner has trained on the first `learned_frames` frames: let the collector
        go up to `frames_ahead` frames further."""
        with self._condition:
            self._limit = learned_frames + self.frames_ahead
            self._condition.notify_all()

    def open(self) -> None:
        """Let the collector run without limit (until the next `allow`)."""
        with self._condition:
            self._limit = math.inf
            self._condition.notify_all()

    @contextmanager
    def opened(self) -> Iterator[None]:
        """No limit within the block (the learner's `allow` sets one again after it)."""
        self.open()
        yield

    def __call__(self) -> None:
        if self.collector is None:
            return
        with self._condition:
            self.stored = (self.collector.frames, len(self.replay_buffer))
            self._condition.wait_for(lambda: self.collector.frames < self._limit)


class StallWatch:
    """Waits a moment for new frames; stops the run when none came for `timeout` seconds (the
    background collection died: `async_shutdown` raises its error)."""

    def __init__(self, collector: Any, timeout: float) -> None:
        self.collector = collector
        self.timeout = timeout
        self.frames = collector.frames
        self.since = time.monotonic()

    def wait(self, frames: int) -> None:
        """Sleep 1 ms (the collector thread runs meanwhile), checking for a stall."""
        now = time.monotonic()
        if frames != self.frames:
            self.frames, self.since = frames, now
        elif now - self.since > self.timeout:
            self.collector.async_shutdown()
            raise RuntimeError(
                f"no new frames for {self.timeout} s: background collection stopped."
            )
        time.sleep(0.001)


class RecentReturns:
    """The returns of the last `size` finished episodes, as a collector's `post_collect_hook`:
    called with each batch in the collector's thread, read by the learner's.

    A batch is `[*env_batch, T]`; rewards are summed per sub-env across batches, and an
    episode's return is recorded at its done flag (terminated or truncated).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> returns = RecentReturns(size=2)
        >>> done = torch.tensor([[False], [True], [False], [True], [True]])
        >>> reward = torch.ones(5, 1)
        >>> returns(TensorDict({"next": {"reward": reward, "done": done}}, batch_size=[5]))
        >>> returns.values(), returns.mean()
        ([2.0, 1.0], 1.5)
    """

    def __init__(self, size: int) -> None:
        self.returns: deque[float] = deque(maxlen=size)
        self.running: list[float] = []
        self._lock = threading.Lock()

    def __call__(self, batch: TensorDictBase) -> None:
        steps = batch.batch_size[-1] if batch.batch_dims else 1
        reward = batch.get((keys.NEXT, keys.REWARD)).reshape(-1, steps, 1).sum(-1)
        done = batch.get((keys.NEXT, keys.DONE)).reshape(-1, steps)
        if len(self.running) != reward.shape[0]:
            self.running = [0.0] * reward.shape[0]
        finished = []
        for env, (rewards, dones) in enumerate(zip(reward.tolist(), done.tolist(), strict=True)):
            for step_reward, step_done in zip(rewards, dones, strict=True):
                self.running[env] += step_reward
                if step_done:
                    finished.append(self.running[env])
                    self.running[env] = 0.0
        with self._lock:
            self.returns.extend(finished)

    def values(self) -> list[float]:
        """The recorded returns, oldest first."""
        with self._lock:
            return list(self.returns)

    def mean(self) -> float:
        """Their mean (NaN before the first episode ends)."""
        values = self.values()
        return sum(values) / len(values) if values else float("nan")

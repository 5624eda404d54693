"""`BatchIteration`: the iteration protocol every collector shares (for, len, with)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tensordict import TensorDictBase


class BatchIteration:
    """`for data in collector`, `len(collector)`, `next(collector)` and `with collector:` on
    top of a collector's `next()`, `shutdown()`, `frames`, `total_frames` and
    `frames_per_batch`, so that every collector iterates and ends the same way."""

    frames: int
    total_frames: int
    frames_per_batch: int

    def next(self) -> TensorDictBase | None:
        raise NotImplementedError

    def shutdown(self, close_env: bool = True) -> None:
        raise NotImplementedError

    @property
    def is_done(self) -> bool:
        """Whether `total_frames` have been collected (never, for an endless collector)."""
        return 0 < self.total_frames <= self.frames

    def __next__(self) -> TensorDictBase | None:
        return self.next()

    def __iter__(self) -> Iterator[TensorDictBase | None]:
        while not self.is_done:
            try:
                batch = self.next()
            except StopIteration:  # e.g. whole episodes: total_frames ran out mid-episode
                return
            yield batch

    @property
    def yields_whole_episodes(self) -> bool:
        """Whether batches are whole episodes (`batch_mode="complete_episodes"`,
        `trajs_per_batch`): their count then depends on how long the episodes last."""
        return False

    def __len__(self) -> int:
        if self.yields_whole_episodes:
            raise TypeError(
                "a collector of whole episodes has no length: how many batches it yields "
                "depends on how long the episodes last."
            )
        if self.total_frames <= 0:
            raise TypeError("an endless collector (total_frames=-1) has no length.")
        return self.total_frames // self.frames_per_batch

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

"""`LinearLearningRate`: an optimiser's learning rates, decayed linearly over a run's progress."""

from __future__ import annotations

from typing import Any


class LinearLearningRate:
    """Sets every param group's learning rate to its configured value times a factor that goes
    linearly from 1 (progress 0) to `end_factor` (progress 1 and beyond).

    Progress is the caller's fraction of the run (e.g. frames / total_frames). A resumed run
    calls `continue_from` with its progress: the rate goes on from the checkpoint's value to
    the end value over the frames that are left, also when `total_frames` grew.

    Examples:
        >>> import torch
        >>> optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1.0)
        >>> schedule = LinearLearningRate(optimizer, end_factor=0.0)
        >>> schedule.set(0.25)
        0.75
        >>> schedule.continue_from(0.5)  # resumed at 0.75 with twice the frames: halfway now
        0.75
        >>> schedule.set(0.75)
        0.375
        >>> schedule.factor(1.0)  # what set(1.0) would apply, e.g. to scale PPO's clip range
        0.0
    """

    def __init__(self, optimizer: Any, end_factor: float) -> None:
        self.optimizer = optimizer
        self.end_factor = end_factor
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]
        self.start_progress = 0.0
        self.start_factor = 1.0

    def continue_from(self, progress: float) -> float:
        """Continue from the learning rate the optimizer holds now (a loaded checkpoint's),
        reached at `progress`, down to `end_factor` at progress 1: a run resumed with a larger
        `total_frames` decays the rest of the way instead of jumping back up. Returns the
        factor it continues from."""
        self.start_progress = min(1.0, max(0.0, progress))
        self.start_factor = self.optimizer.param_groups[0]["lr"] / self.base_lrs[0]
        return self.start_factor

    def factor(self, progress: float) -> float:
        """The factor on the configured learning rates at `progress` (nothing is applied)."""
        span = 1.0 - self.start_progress
        done = 1.0 if span <= 0 else min(1.0, max(0.0, (progress - self.start_progress) / span))
        return self.start_factor + done * (self.end_factor - self.start_factor)

    def set(self, progress: float) -> float:
        """Apply the learning rates for `progress` and return the first group's."""
        factor = self.factor(progress)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base * factor
        return self.base_lrs[0] * factor

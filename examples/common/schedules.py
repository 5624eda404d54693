"""`LinearLearningRate`: an optimiser's learning rates, decayed linearly over a run's progress."""

from __future__ import annotations

from typing import Any


class LinearLearningRate:
    """Sets every param group's learning rate to its configured value times a factor that goes
    linearly from 1 (progress 0) to `end_factor` (progress 1 and beyond).

    Progress is the caller's fraction of the run (e.g. frames / total_frames), so a resumed
    run continues the schedule where it stopped.

    Examples:
        >>> import torch
        >>> optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1.0)
        >>> schedule = LinearLearningRate(optimizer, end_factor=0.0)
        >>> schedule.set(0.25)
        0.75
    """

    def __init__(self, optimizer: Any, end_factor: float) -> None:
        self.optimizer = optimizer
        self.end_factor = end_factor
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]

    def set(self, progress: float) -> float:
        """Apply the learning rates for `progress` and return the first group's."""
        factor = 1.0 + min(1.0, progress) * (self.end_factor - 1.0)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base * factor
        return self.base_lrs[0] * factor

"""Whole trajectories cut out of the workers' chunks (`yield_completed_trajectories=True`).

Each row of a chunk is one env's consecutive steps; a trajectory may span several chunks of
its env. Steps are held by trajectory id until the step whose `("next", "done")` is set, then
the trajectory is complete and waits to be handed out.
"""

from __future__ import annotations

from collections import deque
from typing import cast

import torch
from tensordict import TensorDictBase

from rlcollect import keys

DONE_KEY = (keys.NEXT, keys.DONE)


class CompletedTrajectories:
    """Completed trajectories in the order they ended, and the open ones by trajectory id."""

    def __init__(self) -> None:
        self._open: dict[int, list[TensorDictBase]] = {}
        self._done: deque[TensorDictBase] = deque()
        self.frames = 0  # frames of the completed trajectories waiting

    def add(self, rows: TensorDictBase) -> None:
        """Take a chunk `[envs, steps]`: cut each row at its ends."""
        rows = rows.clone()
        rows.names = None
        done = rows.get(DONE_KEY).reshape(*rows.shape, -1).any(-1)
        for row, row_done in zip(rows.unbind(0), done.unbind(0), strict=True):
            start = 0
            for end in row_done.nonzero().flatten().tolist():
                self._close(row[start : end + 1])
                start = end + 1
            if start < row.shape[0]:
                piece = row[start:]
                self._open.setdefault(self._trajectory_id(piece), []).append(piece)

    def _trajectory_id(self, piece: TensorDictBase) -> int:
        return int(piece.get(keys.TRAJ_IDS)[0])

    def _close(self, piece: TensorDictBase) -> None:
        parts = [*self._open.pop(self._trajectory_id(piece), []), piece]
        trajectory = cast(TensorDictBase, torch.cat(parts, 0)) if len(parts) > 1 else parts[0]  # type: ignore[arg-type]
        self._done.append(trajectory)
        self.frames += trajectory.numel()

    def take(self, frames: int) -> TensorDictBase:
        """Completed trajectories, oldest first, until they hold at least `frames` frames
        (all there are, if fewer), concatenated along time."""
        taken: list[TensorDictBase] = []
        count = 0
        while self._done and (count < frames or not taken):
            trajectory = self._done.popleft()
            taken.append(trajectory)
            count += trajectory.numel()
        self.frames -= count
        batch = cast(TensorDictBase, torch.cat(taken, 0)) if len(taken) > 1 else taken[0]  # type: ignore[arg-type]
        batch.refine_names(keys.TIME_DIM_NAME)
        return batch

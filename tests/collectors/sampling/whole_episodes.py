"""A flat batch's episodes by trajectory id (`episodes_of`), and the check that one is whole."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase


def episodes_of(batch: TensorDictBase) -> list[TensorDictBase]:
    """The trajectories of a flat batch, by trajectory id, in order."""
    ids = batch["collector", "traj_ids"]
    _, counts = torch.unique_consecutive(ids, return_counts=True)
    return list(batch.split(counts.tolist(), 0))


def assert_whole(episode: TensorDictBase) -> None:
    """Starts at an episode's first step (observation 0) and ends done, done only there."""
    assert float(episode["observation"][0, 0]) == 0.0
    done = episode["next", "done"].flatten()
    assert bool(done[-1])
    assert not bool(done[:-1].any())

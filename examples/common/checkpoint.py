"""Checkpoints of an example run: one `torch.save`d dict, written atomically."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_NAME = "checkpoint.pt"


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write `state` to `path` through a temporary file, so a crash never leaves half a file."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    torch.save(state, temporary)
    os.replace(temporary, path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by `save_checkpoint` (tensors and plain Python values only).

    Raises:
        ValueError: when the file is not a checkpoint of these examples.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ValueError(
            f"resume={str(path)!r} is not a readable checkpoint ({err}); pass a checkpoint.pt "
            "written by an example run."
        ) from err
    if not isinstance(state, dict) or "collector" not in state or "frames" not in state:
        raise ValueError(
            f"resume={str(path)!r} is not an example checkpoint: expected a dict with "
            f"'frames' and 'collector' entries, got {type(state).__name__}."
        )
    return state

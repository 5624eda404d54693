"""End-of-trajectory flags: which `done` keys end a trajectory, and which batch elements did."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlcollect import keys

NestedKey = str | tuple[str, ...]


def end_flag_keys(done_keys: Sequence[NestedKey]) -> list[NestedKey]:
    """The `done` flags among `done_keys`, one per group (`"done"`, `("agents", "done")`).

    Raises:
        ValueError: when no flag is named `done`.
    """
    found = [key for key in done_keys if keys.last_name(key) == keys.DONE]
    if not found:
        raise ValueError(
            f"the env's done keys {list(done_keys)} have no 'done' flag; every group of flags "
            "needs one (done = terminated or truncated)."
        )
    return found


def end_of_trajectory(flags: Sequence[torch.Tensor], batch_ndim: int) -> torch.Tensor:
    """OR of `flags` over every dim past the first `batch_ndim`: which batch elements ended a
    trajectory, as a bool tensor. One bool flag of shape `[*batch, 1]` (the common case) costs
    a reshape. A flag of another dtype (an env whose done spec is float, as some of TorchRL's
    test envs have) counts as set where it is non-zero, as TorchRL reads it."""
    first = flags[0]
    batch = first.shape[:batch_ndim]
    if len(flags) == 1 and first.shape[batch_ndim:].numel() == 1:
        ended = first.reshape(batch)
        return ended if ended.dtype is torch.bool else ended != 0
    ended = torch.zeros(batch, dtype=torch.bool, device=first.device)
    for flag in flags:
        ended |= flag.reshape(*batch, -1).any(-1)
    return ended

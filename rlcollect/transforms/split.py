"""Split a batch into zero-padded trajectories: `split_trajectories` and `SplitTrajectories`."""

from __future__ import annotations

import torch
from tensordict import NestedKey, TensorDictBase, unravel_key

from rlcollect.keys import DONE, NEXT, TIME_DIM_NAME, TRAJ_IDS


def _checked_key(key: object, argument: str) -> NestedKey:
    """Return `key` unravelled, or raise a TypeError saying what a key must be."""
    try:
        return unravel_key(key)
    except (RuntimeError, TypeError) as err:
        raise TypeError(
            f"{argument} must be a key (a string or a tuple of strings), got {key!r}; "
            f'pass e.g. ("collector", "traj_ids").'
        ) from err


def _mask_key(trajectory_key: NestedKey) -> NestedKey:
    """The mask sits next to the trajectory ids: ("collector", "traj_ids") -> (..., "mask")."""
    if isinstance(trajectory_key, str):
        return "mask"
    return (*trajectory_key[:-1], "mask")


def _run_starts(
    batch: TensorDictBase, trajectory_key: NestedKey, done_key: NestedKey
) -> torch.Tensor:
    """Flat bool [N]: True where a trajectory starts, in the row-major order of the batch.

    A trajectory starts at the first step of every env row and wherever the trajectory id
    changes; without trajectory ids, right after a done step.
    """
    time_steps = batch.shape[-1]
    traj_ids = batch.get(trajectory_key, None)
    if traj_ids is not None:
        flat = traj_ids.reshape(-1)
        starts = torch.ones_like(flat, dtype=torch.bool)
        starts[1:] = flat[1:] != flat[:-1]
    else:
        done = batch.get(done_key).reshape(-1)
        if done.numel() != batch.numel():
            raise ValueError(
                f"{done_key!r} must hold one flag per step, shape {list(batch.shape)} or "
                f"{[*batch.shape, 1]}, got {list(batch.get(done_key).shape)}."
            )
        starts = torch.ones_like(done, dtype=torch.bool)
        starts[1:] = done[:-1]
    starts.view(-1, time_steps)[:, 0] = True
    return starts


def split_trajectories(
    batch: TensorDictBase,
    *,
    trajectory_key: NestedKey = TRAJ_IDS,
    done_key: NestedKey = (NEXT, DONE),
) -> TensorDictBase:
    """Re-shape a batch `[*env_batch, T]` into `[num_trajs, max_len]`, zero-padded.

    Trajectories are the runs of equal `trajectory_key` values along the time dim of each env
    row (or, when the batch has no such entry, the stretches ended by `done_key`, whose ids are
    then numbered from 0 and written to `trajectory_key`). They come out in the order of the
    flattened batch: env 0's trajectories in time order, then env 1's, and so on, as TorchRL's
    `split_trajectories` orders them. Every entry is padded with zeros (False for booleans,
    including the padded trajectory ids) and a bool mask, True on real steps, is written next to
    the trajectory ids (`("collector", "mask")` by default). The result is a new tensordict with
    names `[None, "time"]` (TorchRL drops the name; we keep it, since the last dim still is
    time, and code that reads names finds it); the input is left untouched.

    Args:
        batch: a batch with at least one dim, the last being time.

    Keyword Args:
        trajectory_key: where the trajectory ids are read. Defaults to `("collector", "traj_ids")`.
        done_key: the done flags used when the batch holds no trajectory ids.
            Defaults to `("next", "done")`.

    Returns:
        The split batch, of batch size `[num_trajs, max_len]`.

    Raises:
        ValueError: if the batch has no dims or no steps, or its done flags do not match it.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> traj_ids = torch.tensor([3, 3, 3, 4, 4])
        >>> batch = TensorDict(
        ...     {"observation": torch.arange(5.0), ("collector", "traj_ids"): traj_ids},
        ...     batch_size=[5],
        ... )
        >>> split = split_trajectories(batch)
        >>> split["observation"]
        tensor([[0., 1., 2.],
                [3., 4., 0.]])
        >>> split["collector", "mask"]
        tensor([[ True,  True,  True],
                [ True,  True, False]])
    """
    if batch.ndim == 0 or batch.numel() == 0:
        raise ValueError(
            f"split_trajectories expects a batch of shape [*env_batch, T] with T > 0, got "
            f"batch_size={list(batch.shape)}; collect at least one step first."
        )
    trajectory_key = _checked_key(trajectory_key, "trajectory_key")
    done_key = _checked_key(done_key, "done_key")
    starts = _run_starts(batch, trajectory_key, done_key)
    flat = batch.reshape(-1)
    if trajectory_key not in batch.keys(include_nested=True):
        flat = flat.copy()
        flat.set(trajectory_key, starts.cumsum(0) - 1)

    # --- where each step goes in the padded [num_trajs, max_len] layout ---
    run_index = starts.cumsum(0) - 1
    first_step = torch.nonzero(starts).squeeze(-1)
    position = torch.arange(starts.numel(), device=starts.device) - first_step[run_index]
    num_trajs = first_step.numel()
    max_len = int(torch.diff(first_step, append=first_step.new_tensor([starts.numel()])).max())
    target = run_index * max_len + position

    def scatter(value: torch.Tensor) -> torch.Tensor:
        padded = value.new_zeros((num_trajs * max_len, *value.shape[1:]))
        padded[target] = value
        return padded.view(num_trajs, max_len, *value.shape[1:])

    out = flat.apply(scatter, batch_size=[num_trajs, max_len])
    mask = torch.zeros(num_trajs * max_len, dtype=torch.bool, device=starts.device)
    mask[target] = True
    out.set(_mask_key(trajectory_key), mask.view(num_trajs, max_len))
    out.names = [None, TIME_DIM_NAME]
    return out


class SplitTrajectories:
    """A post-processor that applies `split_trajectories` to every batch.

    Contract: `__call__(batch)` returns a new tensordict `[num_trajs, max_len]` (see
    `split_trajectories`); the input batch is not modified.

    Args:
        trajectory_key: where the trajectory ids are read. Defaults to `("collector", "traj_ids")`.
        done_key: the done flags used when the batch holds no trajectory ids.
            Defaults to `("next", "done")`.

    Raises:
        TypeError: if a key is neither a string nor a tuple of strings.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> batch = TensorDict(
        ...     {("next", "done"): torch.tensor([[False], [True], [False]])}, batch_size=[3]
        ... )
        >>> split = SplitTrajectories()(batch)
        >>> split.batch_size, split.names
        (torch.Size([2, 2]), [None, 'time'])
        >>> split["collector", "traj_ids"]
        tensor([[0, 0],
                [1, 0]])
    """

    def __init__(
        self, trajectory_key: NestedKey = TRAJ_IDS, done_key: NestedKey = (NEXT, DONE)
    ) -> None:
        self.trajectory_key = _checked_key(trajectory_key, "trajectory_key")
        self.done_key = _checked_key(done_key, "done_key")

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        """Split `batch` into zero-padded trajectories."""
        return split_trajectories(batch, trajectory_key=self.trajectory_key, done_key=self.done_key)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(trajectory_key={self.trajectory_key!r}, "
            f"done_key={self.done_key!r})"
        )

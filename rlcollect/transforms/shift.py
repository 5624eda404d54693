"""Shifted trajectory views for training (RLlib's `shift`): `ShiftedView`."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import NestedKey, TensorDictBase, unravel_key

from rlcollect.keys import DONE, MASK, NEXT, TRAJ_IDS

Shift = int | str | Sequence[int]


def _parse_shift(shift: Shift) -> tuple[list[int], bool]:
    """Return the offsets a shift names and whether they stack along a new dim."""
    if isinstance(shift, bool):
        raise TypeError(f"shift must be an int, a range string or a list of ints, got {shift!r}.")
    if isinstance(shift, int):
        return [shift], False
    if isinstance(shift, str):
        first, separator, last = shift.partition(":")
        try:
            start, stop = int(first), int(last)
        except ValueError as err:
            raise ValueError(
                f'a shift range must read "start:stop" with two ints, got {shift!r}; e.g. "-3:-1".'
            ) from err
        if not separator or start > stop:
            raise ValueError(
                f'a shift range must read "start:stop" with start <= stop, got {shift!r}; '
                'e.g. "-3:-1".'
            )
        return list(range(start, stop + 1)), True
    if (
        isinstance(shift, Sequence)
        and shift
        and all(isinstance(offset, int) and not isinstance(offset, bool) for offset in shift)
    ):
        return [int(offset) for offset in shift], True
    raise TypeError(
        f"shift must be an int, a range string or a non-empty list of ints, got {shift!r}; "
        f'e.g. -1, "-3:-1" or [-2, -1].'
    )


def _default_out_key(key: NestedKey, offsets: list[int], is_stacked: bool) -> NestedKey:
    """Name the view of shift -1 "prev_<name>" and of shift +1 "next_<name>"; others need one."""
    if is_stacked or offsets[0] not in (-1, 1):
        raise ValueError(
            f"out_key is needed for a shift other than -1 or +1, got shift {offsets}; pass e.g. "
            f'out_key="{key if isinstance(key, str) else key[-1]}_window".'
        )
    prefix = "prev_" if offsets[0] == -1 else "next_"
    if isinstance(key, str):
        return prefix + key
    return (*key[:-1], prefix + key[-1])


def _segment_ids(batch: TensorDictBase) -> torch.Tensor:
    """Episode index of every step within its env row ([rows, T]), from traj ids and done flags."""
    time_steps = batch.shape[-1]
    traj_ids = batch.get(TRAJ_IDS, None)
    done = batch.get((NEXT, DONE), None)
    if traj_ids is None and done is None:
        raise KeyError(
            f"ShiftedView needs {TRAJ_IDS!r} or {(NEXT, DONE)!r} to find episode boundaries, and "
            f"the batch has neither; keys: {sorted(map(str, batch.keys(True, True)))}."
        )
    device = (traj_ids if traj_ids is not None else done).device
    starts = torch.zeros(batch.shape, dtype=torch.bool, device=device).view(-1, time_steps)
    if traj_ids is not None:
        traj_ids = traj_ids.reshape(-1, time_steps)
        starts[:, 1:] |= traj_ids[:, 1:] != traj_ids[:, :-1]
    if done is not None:
        starts[:, 1:] |= done.reshape(-1, time_steps)[:, :-1]
    return starts.cumsum(-1)


class ShiftedView:
    """A post-processor that adds a time-shifted copy of an entry, within each episode.

    At step t the view holds `key` at step t + s for each offset s: `shift=-1` gives the previous
    action, `shift=+1` the next one, `"-3:-1"` (both ends included) or `[-2, -1]` several offsets
    stacked along a new dim right after time, in the order given. A step never reads across an
    episode boundary: an offset that leaves the episode (a step after a done step, or with another
    `("collector", "traj_ids")`), the batch, or the real steps of a split batch (its
    `("collector", "mask")`) reads zeros, so the view is zero-padded at episode start and end.

    Contract: `__call__(batch)` takes a batch `[*env_batch, T]` (time last) with `key` and
    `("collector", "traj_ids")` or `("next", "done")`, and returns a shallow copy with `out_key`
    added, of shape `[*env_batch, T, *feature]` (one offset) or `[*env_batch, T, K, *feature]`
    (K stacked offsets); the input is not modified. `key` may name a sub-tensordict.

    Args:
        key: the entry to shift, e.g. `"action"` or `("next", "reward")`.
        shift: an int, a range string `"start:stop"`, or a list of ints.
        out_key: where the view goes. Defaults to `"prev_<name>"` for `shift=-1` and
            `"next_<name>"` for `shift=1` (same prefix as `key`); required for other shifts.

    Raises:
        TypeError: if `key`, `shift` or `out_key` has the wrong type.
        ValueError: if a range string is malformed, or `out_key` is missing where required.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> batch = TensorDict(
        ...     {
        ...         "action": torch.arange(1, 6),
        ...         ("next", "done"): torch.tensor([[0], [1], [0], [0], [0]], dtype=torch.bool),
        ...     },
        ...     batch_size=[5],
        ... )
        >>> ShiftedView("action", -1)(batch)["prev_action"]
        tensor([0, 1, 0, 3, 4])
        >>> ShiftedView("action", "-2:-1", out_key="past_actions")(batch)["past_actions"]
        tensor([[0, 0],
                [0, 1],
                [0, 0],
                [0, 3],
                [3, 4]])
    """

    def __init__(self, key: NestedKey, shift: Shift, out_key: NestedKey | None = None) -> None:
        self.key = self._checked_key(key, "key")
        self.offsets, self.is_stacked = _parse_shift(shift)
        if out_key is None:
            self.out_key = _default_out_key(self.key, self.offsets, self.is_stacked)
        else:
            self.out_key = self._checked_key(out_key, "out_key")

    @staticmethod
    def _checked_key(key: object, argument: str) -> NestedKey:
        try:
            return unravel_key(key)
        except (RuntimeError, TypeError) as err:
            raise TypeError(
                f"{argument} must be a key (a string or a tuple of strings), got {key!r}; "
                'e.g. "action".'
            ) from err

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        """Return a shallow copy of `batch` with the shifted view under `out_key`."""
        if batch.ndim == 0:
            raise ValueError(
                "ShiftedView expects a batch of shape [*env_batch, T] with time last, got "
                "batch_size=[]; unsqueeze a single step to [1]."
            )
        source, keeps = self._gather_plan(batch)
        rows = source.shape[0] * batch.shape[-1]
        offsets = len(self.offsets)
        view_shape = [*batch.shape, offsets] if self.is_stacked else list(batch.shape)

        def shifted(value: torch.Tensor) -> torch.Tensor:
            feature_shape = value.shape[batch.ndim :]
            flat = value.reshape(rows, *feature_shape)[source.reshape(-1)]
            keep = keeps.reshape(-1, *[1] * len(feature_shape))
            return flat.masked_fill(~keep, 0).reshape(*view_shape, *feature_shape)

        value = batch.get(self.key)
        if isinstance(value, TensorDictBase):
            view = value.apply(shifted, batch_size=view_shape)
        else:
            view = shifted(value)
        out = batch.copy()
        out.set(self.out_key, view)
        return out

    def _gather_plan(self, batch: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat source index [rows, T, K] of each view element, and whether it is kept."""
        time_steps = batch.shape[-1]
        segment = _segment_ids(batch)
        rows = segment.shape[0]
        offsets = torch.tensor(self.offsets, device=segment.device)
        time = torch.arange(time_steps, device=segment.device)
        target = time.unsqueeze(-1) + offsets  # [T, K]
        clamped = target.clamp(0, time_steps - 1)
        keeps = (segment[:, clamped] == segment.unsqueeze(-1)) & (
            (target >= 0) & (target < time_steps)
        )
        mask = batch.get(MASK, None)
        if mask is not None:
            mask = mask.reshape(rows, time_steps)
            keeps &= mask[:, clamped] & mask.unsqueeze(-1)
        source = torch.arange(rows, device=segment.device).view(rows, 1, 1) * time_steps + clamped
        return source, keeps

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(key={self.key!r}, offsets={self.offsets}, "
            f"out_key={self.out_key!r})"
        )

"""The carrier: the preallocated `[*B, L + 1]` TensorDict an env's buffer face writes into."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDict, TensorDictBase

from rlcollect import keys
from rlcollect.batch.flags import end_flag_keys, end_of_trajectory
from rlcollect.envs.non_tensor import (
    copy_non_tensor,
    non_tensor_keys,
    time_index,
    write_non_tensor,
)
from rlcollect.envs.specs import Composite

NestedKey = str | tuple[str, ...]


def allocate_carrier(
    full_spec: Composite, steps: int, device: torch.device | str | None = None
) -> TensorDict:
    """Zero-filled carrier for `steps` steps: batch `[*spec batch, steps + 1]`, last dim "time".

    Every leaf of `full_spec` (root keys and the `"next"` sub-spec) gets one tensor of shape
    `[*batch, steps + 1, *feature_shape]`.
    """
    batch = full_spec.shape
    shape = torch.Size([*batch, steps + 1])
    data: dict = {}
    for key, spec in full_spec.leaves():
        feature = spec.shape[len(batch) :]
        tensor = torch.zeros((*shape, *feature), dtype=spec.dtype, device=device or spec.device)
        target = data
        for part in key[:-1]:
            target = target.setdefault(part, {})
        target[key[-1]] = tensor
    carrier = TensorDict(data, batch_size=shape, device=device)
    carrier.refine_names(*([None] * len(batch)), keys.TIME_DIM_NAME)
    return carrier


class CarrierViews:
    """Per-time-step TensorDict views of a carrier, built once per step index and reused.

    Used by TensorDict-first envs to run their buffer face: reading the root at `t`, writing
    the step results at `t` and the next root at `t + 1`.
    """

    def __init__(self, carrier: TensorDictBase, done_keys: Sequence[NestedKey]) -> None:
        self.carrier = carrier
        self.batch_ndim = carrier.batch_dims - 1
        self.done_keys = list(done_keys)
        self._end_keys = end_flag_keys(self.done_keys)
        self._root_views: dict[int, TensorDictBase] = {}
        self._next_views: dict[int, TensorDictBase] = {}
        self._next = carrier.get(keys.NEXT)
        # Non-tensor entries are not in the views (an index of them is a copy): they are read
        # and written through the carrier itself.
        self.root_extras = non_tensor_keys(carrier.exclude(keys.NEXT))
        self.next_extras = non_tensor_keys(self._next)

    def root(self, t: int) -> TensorDictBase:
        """The root keys at time `t` (views into the carrier)."""
        view = self._root_views.get(t)
        if view is None:
            view = self.carrier.exclude(keys.NEXT)[(Ellipsis, t)]
            self._root_views[t] = view
        return view

    def next(self, t: int) -> TensorDictBase:
        """The `"next"` keys at time `t` (views into the carrier)."""
        view = self._next_views.get(t)
        if view is None:
            view = self._next[(Ellipsis, t)]
            self._next_views[t] = view
        return view

    def root_with_extras(self, t: int) -> TensorDictBase:
        """A copy of the root at `t`, non-tensor entries included (what an env is handed)."""
        request = self.root(t).exclude(keys.NEXT).clone()
        for key in self.root_extras:
            request.set(key, self.carrier.get(key)[time_index(self.batch_ndim, t)])
        return request

    def write_root(self, t: int, values: TensorDictBase, mask: torch.Tensor | None = None) -> None:
        """Copy `values` into the root at `t`; with `mask`, only the selected sub-envs."""
        view = self.root(t)
        for key in values.keys(include_nested=True, leaves_only=True):
            if key == keys.RESET or key not in view.keys(include_nested=True):
                continue
            write_masked(view.get(key), values.get(key), mask)
        present = values.keys(include_nested=True)
        for key in self.root_extras:
            if key in present:
                index = time_index(self.batch_ndim, t)
                write_non_tensor(self.carrier, key, values.get(key), index, mask)

    def write_next(self, t: int, values: TensorDictBase) -> None:
        """Copy the step results `values` into `"next"` at `t`."""
        view = self.next(t)
        present = values.keys(include_nested=True)
        for key in view.keys(include_nested=True, leaves_only=True):
            if key in present:
                view.get(key).copy_(values.get(key))
        for key in self.next_extras:
            if key in present:
                write_non_tensor(self._next, key, values.get(key), time_index(self.batch_ndim, t))

    def move_to_root(self, t: int, moved: Sequence[NestedKey]) -> None:
        """Root `t + 1` = `"next"` at `t`, for the keys `moved`."""
        root, next_view = self.root(t + 1), self.next(t)
        extras = set(self.root_extras)
        for key in moved:
            if key in extras:
                index = time_index(self.batch_ndim, t)
                later = time_index(self.batch_ndim, t + 1)
                copy_non_tensor(self._next, self.carrier, key, index, later)
            else:
                root.get(key).copy_(next_view.get(key))

    def carry_observations(self, t: int, observation_keys: Sequence[NestedKey]) -> None:
        """Root observations at `t + 1` = next observations at `t`; root flags cleared."""
        self.move_to_root(t, [keys.plain_key(key) for key in observation_keys])
        root = self.root(t + 1)
        for name in self.done_keys:
            root.get(name).zero_()

    def next_done(self, t: int) -> torch.Tensor:
        """Which sub-envs ended a trajectory at `t`, shaped as the env batch: `("next",
        "done")`, or any `done` flag of any group when the env's flags are nested."""
        view = self.next(t)
        return end_of_trajectory([view.get(key) for key in self._end_keys], self.batch_ndim)


def write_masked(target: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None) -> None:
    """`target[mask] = value[mask]` in place, the mask broadcast over the feature dims."""
    if mask is None:
        target.copy_(value)
        return
    expanded = mask.reshape(*mask.shape, *([1] * (target.ndim - mask.ndim)))
    target.copy_(torch.where(expanded, value.to(target.dtype), target))

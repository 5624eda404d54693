"""The carrier: the preallocated `[*B, L + 1]` TensorDict an env's buffer face writes into."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDict, TensorDictBase

from rlcollect import keys
from rlcollect.envs.specs import Composite


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


def time_slice(tensor: torch.Tensor, batch_ndim: int, t: int) -> torch.Tensor:
    """The view of `tensor` at time index `t` (time is the dim right after the env batch)."""
    return tensor.select(batch_ndim, t)


class CarrierViews:
    """Per-time-step TensorDict views of a carrier, built once per step index and reused.

    Used by TensorDict-first envs to run their buffer face: reading the root at `t`, writing
    the step results at `t` and the next root at `t + 1`.
    """

    def __init__(self, carrier: TensorDictBase, done_keys: Sequence[str]) -> None:
        self.carrier = carrier
        self.batch_ndim = carrier.batch_dims - 1
        self.done_keys = list(done_keys)
        self._root_views: dict[int, TensorDictBase] = {}
        self._next_views: dict[int, TensorDictBase] = {}
        self._next = carrier.get(keys.NEXT)

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

    def write_root(self, t: int, values: TensorDictBase, mask: torch.Tensor | None = None) -> None:
        """Copy `values` into the root at `t`; with `mask`, only the selected sub-envs."""
        view = self.root(t)
        for key in values.keys(include_nested=True, leaves_only=True):
            if key == keys.RESET or key not in view.keys(include_nested=True):
                continue
            write_masked(view.get(key), values.get(key), mask)

    def write_next(self, t: int, values: TensorDictBase) -> None:
        """Copy the step results `values` into `"next"` at `t`."""
        view = self.next(t)
        for key in view.keys(include_nested=True, leaves_only=True):
            if key in values.keys(include_nested=True):
                view.get(key).copy_(values.get(key))

    def carry_observations(self, t: int, observation_keys: Sequence[tuple[str, ...]]) -> None:
        """Root observations at `t + 1` = next observations at `t`; root flags cleared."""
        root, next_view = self.root(t + 1), self.next(t)
        for key in observation_keys:
            root.get(key).copy_(next_view.get(key))
        for name in self.done_keys:
            root.get(name).zero_()

    def next_done(self, t: int) -> torch.Tensor:
        """The `("next", "done")` flags at `t`, shaped as the env batch."""
        done = self.next(t).get(keys.DONE)
        return done.reshape(done.shape[: self.batch_ndim])


def write_masked(target: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None) -> None:
    """`target[mask] = value[mask]` in place, the mask broadcast over the feature dims."""
    if mask is None:
        target.copy_(value)
        return
    expanded = mask.reshape(*mask.shape, *([1] * (target.ndim - mask.ndim)))
    target.copy_(torch.where(expanded, value.to(target.dtype), target))

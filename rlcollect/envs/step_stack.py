"""`StepViews`: the buffer face over a carrier stacked lazily over time, one TensorDict a step.

An env whose entries cannot share one preallocated buffer (heterogeneous agents whose
observations differ in shape, or dynamic specs whose shapes change from step to step) runs
over such a carrier: a `LazyStackedTensorDict` over the time dim of `L + 1` TensorDicts of
one step each. Writing a step replaces its entries (a ragged entry may change shape), so the
carrier is read through its step TensorDicts, never through views cached once.
"""

from __future__ import annotations

import torch
from tensordict import LazyStackedTensorDict, TensorDictBase

from rlcollect import keys

NestedKey = str | tuple[str, ...]


def is_step_stack(carrier: TensorDictBase) -> bool:
    """Whether `carrier` is stacked lazily over its last (time) dim, one TensorDict a step."""
    return (
        isinstance(carrier, LazyStackedTensorDict) and carrier.stack_dim == carrier.batch_dims - 1
    )


class StepViews:
    """Reads and writes of the buffer face over a step stack (see the module docstring).

    The same methods as `CarrierViews`, for TensorDict-first envs (`TorchRLEnv`).

    Args:
        carrier: a `LazyStackedTensorDict` of batch `[*env_batch, L + 1]` stacked on its last
            dim.
    """

    def __init__(self, carrier: TensorDictBase) -> None:
        if not is_step_stack(carrier):
            raise TypeError(
                "StepViews needs a LazyStackedTensorDict stacked over its last (time) dim; got "
                f"{type(carrier).__name__} of batch {tuple(carrier.batch_size)}."
            )
        self.steps: list[TensorDictBase] = list(carrier.tensordicts)

    def root(self, t: int) -> TensorDictBase:
        """The root keys at time `t` (the step's own entries, not copies)."""
        return self.steps[t].exclude(keys.NEXT)

    def next(self, t: int) -> TensorDictBase:
        """The `"next"` keys at time `t` (the step's own sub-TensorDict)."""
        return self.steps[t].get(keys.NEXT)

    def root_with_extras(self, t: int) -> TensorDictBase:
        """A copy of the root at `t` (non-tensor entries are entries of the step)."""
        return self.root(t).clone()

    def write_root(self, t: int, values: TensorDictBase, mask: torch.Tensor | None = None) -> None:
        """Set the root entries at `t` that `values` holds; with `mask` (env-batch shaped),
        only the selected sub-envs take them."""
        root = self.steps[t]
        present = _leaf_keys(root.exclude(keys.NEXT))
        written = values.select(*[key for key in _leaf_keys(values) if key in present]).clone()
        if mask is not None:
            written = _where(
                mask.reshape(root.batch_size), written, root.select(*_leaf_keys(written))
            )
        root.update(written)

    def write_next(self, t: int, values: TensorDictBase) -> None:
        """Set the step results `values` into `"next"` at `t`."""
        self.next(t).update(values.clone())

    def move_to_root(self, t: int, moved: list[NestedKey]) -> None:
        """Root `t + 1` = `"next"` at `t`, for the keys `moved`."""
        self.steps[t + 1].update(self.next(t).select(*moved).clone())


def _leaf_keys(data: TensorDictBase) -> list[NestedKey]:
    return list(data.keys(include_nested=True, leaves_only=True))


def _where(mask: torch.Tensor, new: TensorDictBase, old: TensorDictBase) -> TensorDictBase:
    """`new` where `mask` (over the leading env-batch dims) holds, `old` elsewhere; per
    sub-TensorDict, so heterogeneous (lazily stacked) entries keep their shapes."""
    batch = mask.ndim

    def pick(value: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
        selector = mask.reshape(*mask.shape, *([1] * (value.ndim - batch)))
        return torch.where(selector.to(value.device), value, kept)

    return new.apply(pick, old)

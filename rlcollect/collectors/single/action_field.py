"""How the buffer layout's `action` field holds an env's discrete action: its index or one-hot.

A discrete action of `n` choices fits an `action` field of one number per index (its index, as
SB3's rollout buffer stores it: `action_dim=1` for one choice per step) or of `n` numbers per
index (its one-hot: `action_dim=n`), whichever encoding the env takes. The env still receives
the action in its own encoding: the collector writes it into its own scratch entry, and the
field gets the other encoding once per rollout, after the loop (`StorageBinding.write_back`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

Convert = Callable[[torch.Tensor], torch.Tensor]

# The spec classes of a discrete action, by name: ours (`rlcollect.envs.specs`) and TorchRL's
# share them, and TorchRL stays optional. `Multi*` specs (several sizes) are neither.
_ONE_HOT = "OneHot"
_CATEGORICAL = "Categorical"


def _spec_kind(spec: object) -> str | None:
    for cls in type(spec).__mro__:
        if cls.__name__.startswith("Multi"):
            return None
        if cls.__name__ in (_ONE_HOT, _CATEGORICAL):
            return cls.__name__
    return None


@dataclass(frozen=True)
class DiscreteAction:
    """An env's discrete action, per frame.

    Attributes:
        n: the number of choices of each index.
        index_shape: the shape of its indices per frame (`()` for one choice per step).
        is_one_hot: whether the env takes it one-hot (`[*index_shape, n]`) rather than as
            indices.
    """

    n: int
    index_shape: torch.Size
    is_one_hot: bool

    @classmethod
    def of(cls, spec: Any, batch_dims: int) -> DiscreteAction | None:
        """The discrete action of the action spec `spec` (of `batch_dims` env batch dims), or
        None when it is not a one-hot or categorical spec of one number of choices."""
        kind = _spec_kind(spec)
        if kind is None:
            return None
        frame = torch.Size(tuple(spec.shape)[batch_dims:])
        choices = torch.as_tensor(spec.n).unique()
        if choices.numel() != 1:  # categorical indices of several sizes (MultiDiscrete)
            return None
        if kind == _ONE_HOT:
            return cls(int(choices), frame[:-1], is_one_hot=True)
        return cls(int(choices), frame, is_one_hot=False)

    @property
    def index_numel(self) -> int:
        """Numbers per frame as indices."""
        return math.prod(self.index_shape)

    @property
    def one_hot_numel(self) -> int:
        """Numbers per frame one-hot."""
        return self.index_numel * self.n

    def describe(self) -> str:
        """E.g. `"a one-hot action of 2 choices"`."""
        encoding = "one-hot" if self.is_one_hot else "categorical"
        return f"a {encoding} action of {self.n} choices"

    def accepted(self, name: str) -> str:
        """The sizes a field `name` may be allocated with, e.g. `"action_dim=1 (the action's
        index) or action_dim=2 (its one-hot)"`."""
        return (
            f"{name}={self.index_numel} (the action's index) or {name}={self.one_hot_numel} "
            "(its one-hot)"
        )

    def is_written_by(self, action: torch.Tensor) -> bool:
        """Whether the collector's entry `action` (`[*B, T + 1, *frame]`) is in the env's
        encoding (a policy may write another shape, with a warning at construction)."""
        frame = (*self.index_shape, self.n) if self.is_one_hot else self.index_shape
        return tuple(action.shape[action.dim() - len(frame) :]) == tuple(frame)

    def fits(self, per_step: int) -> bool:
        """Whether a field of `per_step` numbers per step holds the indices or the one-hot."""
        return per_step in (self.index_numel, self.one_hot_numel)

    def conversion(self, per_step: int) -> Convert | None:
        """How the collector's entry, in the env's encoding, becomes a field of `per_step`
        numbers per step (one `fits`): None when it is written as it is, else the function
        that gives the field's encoding (a one-slot field takes the index, even for `n=1`)."""
        if self.is_one_hot:
            return _index_of_one_hot if per_step == self.index_numel else None
        if per_step == self.index_numel:
            return None
        n = self.n
        return lambda index: torch.nn.functional.one_hot(index.long(), n)


def _index_of_one_hot(one_hot: torch.Tensor) -> torch.Tensor:
    return one_hot.argmax(-1)

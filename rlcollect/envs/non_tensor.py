"""Non-tensor entries (`NonTensorData`, e.g. a string a TorchRL transform writes) in a carrier.

They cannot be preallocated tensors: the carrier holds them as a `NonTensorStack` over
`[*B, L + 1]`, and an index of it is a copy, not a view. So they are read and written through
the carrier itself at an index (`set_at_`), never through the cached per-step views.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from tensordict import TensorDictBase, is_non_tensor

NestedKey = str | tuple[str, ...]


def non_tensor_keys(tensordict: TensorDictBase) -> list[NestedKey]:
    """The keys of `tensordict`'s non-tensor leaves, at any depth."""
    return list(_walk(tensordict, ()))


def _walk(tensordict: TensorDictBase, prefix: tuple[str, ...]) -> Iterator[NestedKey]:
    for name, value in tensordict.items():
        key = (*prefix, name)
        if is_non_tensor(value):
            yield key[0] if len(key) == 1 else key
        elif isinstance(value, TensorDictBase):
            yield from _walk(value, key)


def time_index(batch_ndim: int, t: int | slice) -> tuple:
    """The index of time `t` in a `[*B, L + 1]` TensorDict."""
    return (*([slice(None)] * batch_ndim), t)


def write_non_tensor(
    target: TensorDictBase,
    key: NestedKey,
    value: object,
    index: tuple,
    mask: torch.Tensor | None = None,
) -> None:
    """`target[key][index] = value`, only for the sub-envs in `mask` when one is given."""
    if mask is None or bool(mask.all()):
        target.set_at_(key, value, index)
        return
    batch_ndim = len(index) - 1
    for position in torch.nonzero(mask.reshape(mask.shape[:batch_ndim])).tolist():
        target.set_at_(key, value[tuple(position)], (*position, index[-1]))  # type: ignore[index]


def copy_non_tensor(
    source: TensorDictBase,
    target: TensorDictBase,
    key: NestedKey,
    source_index: tuple,
    index: tuple,
) -> None:
    """`target[key][index] = source[key][source_index]`."""
    target.set_at_(key, source.get(key)[source_index], index)

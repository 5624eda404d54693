"""The layout of one stored frame: its keys, dtypes and feature shapes."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

Key = tuple[str, ...]

# The leaves of a frame batch come from a storage that checked their shapes on the way in, so
# samples skip TensorDict's validation (half the cost of building one) where tensordict allows.
_build_tensordict = getattr(TensorDict, "_new_unsafe", TensorDict)


@dataclass(frozen=True)
class LeafLayout:
    """One leaf of a frame: its key (``()`` for a plain tensor), dtype and per-frame shape.

    Examples:
        >>> leaf = LeafLayout(("next", "observation"), torch.float32, (4,))
        >>> LeafLayout.from_json(leaf.to_json()) == leaf, leaf.numel
        (True, 4)
    """

    key: Key
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        """Number of elements of this leaf in one frame."""
        return math.prod(self.shape)

    def to_json(self) -> dict[str, Any]:
        """A JSON-serializable description of the leaf."""
        return {"key": list(self.key), "dtype": str(self.dtype), "shape": list(self.shape)}

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> LeafLayout:
        """Rebuilds a leaf from :meth:`to_json`'s output."""
        dtype = getattr(torch, entry["dtype"].removeprefix("torch."))
        return cls(tuple(entry["key"]), dtype, tuple(entry["shape"]))


def _display(key: Key) -> str:
    return repr(key[0]) if len(key) == 1 else repr(key)


class FrameLayout:
    """The keys, dtypes and shapes that every frame written to a storage must have.

    A storage learns its layout from its first write and then checks every later batch against it,
    so that a batch with other keys or shapes is refused before anything is written. The batch
    dims a nested TensorDict has beyond the frame's (a group of agents' `n_agents` under
    `"agents"`) are kept too, and samples give them back.

    Args:
        leaves: the leaves of one frame, in storage order.
        is_tensordict: whether frames are TensorDicts (else a single plain tensor).
        nested_batch_shapes: the per-frame batch shape of each nested TensorDict that has one
            (e.g. `{("agents",): (3,)}`); those without extra batch dims are left out.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> batch = TensorDict({"obs": torch.zeros(5, 4), "next": {"r": torch.zeros(5, 1)}}, [5])
        >>> layout = FrameLayout.from_batch(batch, batch_dims=1)
        >>> [leaf.key for leaf in layout.leaves]
        [('obs',), ('next', 'r')]
        >>> [tuple(t.shape) for t in layout.frames_of(batch, batch_dims=1)]
        [(5, 4), (5, 1)]
    """

    def __init__(
        self,
        leaves: Sequence[LeafLayout],
        is_tensordict: bool,
        nested_batch_shapes: Mapping[Key, tuple[int, ...]] | None = None,
    ) -> None:
        self.leaves = tuple(leaves)
        self.is_tensordict = is_tensordict
        self.nested_batch_shapes = dict(nested_batch_shapes or {})
        self._position = {leaf.key: i for i, leaf in enumerate(self.leaves)}

    @classmethod
    def from_batch(cls, data: TensorDictBase | torch.Tensor, batch_dims: int) -> FrameLayout:
        """Reads the layout of the frames of ``data`` (whose first ``batch_dims`` dims are frames).

        Raises:
            TypeError: ``data`` is neither a TensorDict nor a tensor, or holds non-tensor leaves.
        """
        if isinstance(data, torch.Tensor):
            return cls([LeafLayout((), data.dtype, tuple(data.shape[batch_dims:]))], False)
        if not isinstance(data, TensorDictBase):
            raise TypeError(
                f"a tensor storage holds TensorDicts or tensors, got {type(data).__name__}; "
                "use ListStorage for arbitrary Python objects."
            )
        leaves = []
        nested_batch_shapes: dict[Key, tuple[int, ...]] = {}
        for key, value in data.items(include_nested=True):
            full_key = (key,) if isinstance(key, str) else tuple(key)
            if isinstance(value, TensorDictBase):
                if value.batch_dims > batch_dims:
                    nested_batch_shapes[full_key] = tuple(value.batch_size[batch_dims:])
                continue
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"entry {key!r} is a {type(value).__name__}, not a tensor; a tensor storage "
                    "only holds tensor leaves (use ListStorage for arbitrary objects)."
                )
            leaves.append(LeafLayout(full_key, value.dtype, tuple(value.shape[batch_dims:])))
        if not leaves:
            raise ValueError("cannot store a TensorDict without any tensor entry.")
        return cls(leaves, True, nested_batch_shapes)

    def frames_of(self, data: TensorDictBase | torch.Tensor, batch_dims: int) -> list[torch.Tensor]:
        """The leaves of ``data`` in storage order, each reshaped to ``[num_frames, *shape]``.

        Raises:
            ValueError: the keys or per-frame shapes of ``data`` differ from this layout.
            TypeError: ``data`` is a TensorDict where tensors are stored, or the reverse.
        """
        if isinstance(data, torch.Tensor):
            if self.is_tensordict:
                raise TypeError("this storage holds TensorDicts; got a plain tensor.")
            values = [data]
        elif isinstance(data, TensorDictBase) and self.is_tensordict:
            found = {
                (key,) if isinstance(key, str) else key: value
                for key, value in data.items(include_nested=True, leaves_only=True)
            }
            if found.keys() != self._position.keys():
                raise ValueError(self._key_mismatch(found))
            values = [found[leaf.key] for leaf in self.leaves]
        else:
            raise TypeError(f"this storage holds tensors; got a {type(data).__name__}.")
        batch_shape = values[0].shape[:batch_dims]
        num_frames = math.prod(batch_shape)
        frames = []
        for leaf, value in zip(self.leaves, values, strict=True):
            if (
                tuple(value.shape[batch_dims:]) != leaf.shape
                or value.shape[:batch_dims] != batch_shape
            ):
                raise ValueError(
                    f"entry {_display(leaf.key) if leaf.key else 'tensor'} has shape "
                    f"{tuple(value.shape)}, expected a batch of frames of shape {leaf.shape} "
                    f"(the shape of the first write to this storage); every batch written "
                    "to one buffer must have the same per-frame shapes."
                )
            frames.append(value.reshape(num_frames, *leaf.shape) if batch_dims != 1 else value)
        return frames

    def _key_mismatch(self, found: dict) -> str:
        found_keys = set(found)
        expected = set(self._position)
        missing = "[" + ", ".join(sorted(_display(k) for k in expected - found_keys)) + "]"
        unexpected = "[" + ", ".join(sorted(_display(k) for k in found_keys - expected)) + "]"
        return (
            f"the batch's keys do not match the storage's: missing {missing}, unexpected "
            f"{unexpected}. The storage took its keys from its first write; write batches "
            "with exactly those keys (select or add entries before extending)."
        )

    def assemble(
        self, values: Sequence[torch.Tensor], batch_size: torch.Size
    ) -> TensorDict | torch.Tensor:
        """Builds a frame batch (a TensorDict or a tensor) from leaves in storage order."""
        if not self.is_tensordict:
            return values[0]
        root: dict[str, Any] = {}
        for leaf, value in zip(self.leaves, values, strict=True):
            node = root
            for part in leaf.key[:-1]:
                node = node.setdefault(part, {})
            node[leaf.key[-1]] = value
        if self.nested_batch_shapes:
            return self._nested(root, (), batch_size)
        return _build_tensordict(root, batch_size=batch_size)

    def _nested(self, node: dict[str, Any], key: Key, batch_size: torch.Size) -> TensorDict:
        """The TensorDict of `node` (at `key`), nested ones with their own batch dims."""
        entries = {
            name: self._nested(value, (*key, name), batch_size)
            if isinstance(value, dict)
            else value
            for name, value in node.items()
        }
        shape = torch.Size([*batch_size, *self.nested_batch_shapes.get(key, ())])
        return _build_tensordict(entries, batch_size=shape)

    def index_of(self, key: str | Key) -> int:
        """Position of ``key`` among the leaves.

        Raises:
            KeyError: the storage has no such entry.
        """
        full_key = (key,) if isinstance(key, str) else tuple(key)
        if full_key not in self._position:
            raise KeyError(
                f"the storage has no entry {key!r}; it holds "
                f"[{', '.join(_display(k) for k in self._position)}]."
            )
        return self._position[full_key]

    def to_json(self) -> dict[str, Any]:
        """A JSON-serializable description of the layout."""
        return {
            "is_tensordict": self.is_tensordict,
            "leaves": [leaf.to_json() for leaf in self.leaves],
            "nested_batch_shapes": [
                {"key": list(key), "shape": list(shape)}
                for key, shape in self.nested_batch_shapes.items()
            ],
        }

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> FrameLayout:
        """Rebuilds a layout from :meth:`to_json`'s output (written without nested batch
        shapes by earlier versions)."""
        nested = {tuple(e["key"]): tuple(e["shape"]) for e in entry.get("nested_batch_shapes", [])}
        leaves = [LeafLayout.from_json(e) for e in entry["leaves"]]
        return cls(leaves, entry["is_tensordict"], nested)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, FrameLayout)
            and self.leaves == other.leaves
            and self.is_tensordict == other.is_tensordict
            and self.nested_batch_shapes == other.nested_batch_shapes
        )

    def __hash__(self) -> int:
        return hash((self.leaves, self.is_tensordict, tuple(self.nested_batch_shapes.items())))

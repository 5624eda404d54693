"""A user's `[*B, T + 1]` rollout storage as the carrier the rollout loop writes.

Where the storage holds an entry of the collector's shape, dtype and device, the loop writes
into the storage's own tensor; where it holds the entry in another dtype (a float32 action for
a discrete env) or on another device, the loop writes into a scratch tensor of the collector's,
copied into the storage once after the loop (`StorageBinding.write_back`): never a per-step
cast. Both layouts of `rlcollect/batch/rollout_layout.py` are bound here:

* the TorchRL layout: the storage's keys are the collector's; keys it lacks are added to it;
* the buffer layout (`obs`, `action`, `value`, ...): each field stands for its TorchRL key
  (`field_of_key`), viewed with the collector's per-step shape (`reward` `[N, T + 1]` as
  `("next", "reward")` `[N, T + 1, 1]`); the collector's other entries (the root flags, the
  next observation, trajectory ids) live in scratch only, and the storage is left as it is.
  A discrete action's `action` field holds its index or its one-hot, whichever the env takes
  (`action_field.py`): one written back as it is, the other converted once per rollout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.batch.rollout_layout import ACTION, OBS, field_of_key
from rlcollect.collectors.single.action_field import Convert, DiscreteAction

NestedKey = str | tuple[str, ...]


@dataclass(frozen=True)
class WriteBack:
    """One scratch entry of the carrier and where it goes in the storage after a loop.

    Attributes:
        destination: the storage's tensor.
        scratch: the carrier's entry.
        convert: what the entry goes through first (a one-hot action to its index, say).
    """

    destination: torch.Tensor
    scratch: torch.Tensor
    convert: Convert | None = None

    def copy(self) -> None:
        """Copy `scratch` (converted) into `destination`, casting its dtype, across devices."""
        source = self.scratch if self.convert is None else self.convert(self.scratch)
        self.destination.copy_(source.reshape(self.destination.shape))


@dataclass
class StorageBinding:
    """The loop's carrier over a storage, and the scratch entries copied into it after a loop.

    Attributes:
        carrier: the collector's keys, as the storage's tensors or as scratch.
        write_backs: the scratch entries and where they go in the storage.
    """

    carrier: TensorDictBase
    write_backs: list[WriteBack] = field(default_factory=list)

    def write_back(self) -> None:
        """Copy every scratch entry into the storage (casting its dtype, across devices)."""
        for write_back in self.write_backs:
            write_back.copy()


def _describe(entry: object) -> str:
    if isinstance(entry, torch.Tensor):
        return f"{tuple(entry.shape)} {entry.dtype}"
    return type(entry).__name__


def _check_batch(carrier: TensorDictBase, storage: object) -> TensorDictBase:
    if not isinstance(storage, TensorDictBase):
        raise TypeError(
            f"the rollout storage must be a TensorDict of batch [*env batch, T + 1], got "
            f"{type(storage).__name__}; use RolloutBuffer(...).start_rollout()."
        )
    expected = carrier.batch_size
    if storage.batch_size != expected:
        raise ValueError(
            f"the rollout storage has batch {tuple(storage.batch_size)}; this collector "
            f"writes {tuple(expected)} ([*env batch, frames_per_batch / env batch + 1])."
        )
    return storage


def _tensor_keys(carrier: TensorDictBase) -> list[NestedKey]:
    return [
        key
        for key in carrier.keys(include_nested=True, leaves_only=True)
        if isinstance(carrier.get(key), torch.Tensor)
    ]


def _bound(
    carrier: TensorDictBase,
    destinations: dict[NestedKey, torch.Tensor],
    conversions: dict[NestedKey, Convert] | None = None,
) -> StorageBinding:
    """A copy of `carrier` whose entries are views of `destinations` (each holding as many
    numbers per step as the collector's entry) where dtype and device agree and the layout
    allows a view, and scratch entries written back elsewhere (through `conversions` where
    the storage holds another encoding)."""
    conversions = conversions or {}
    bound = carrier.clone()
    binding = StorageBinding(bound)
    for key, destination in destinations.items():
        ours = bound.get(key)
        try:
            view = None if key in conversions else destination.view(ours.shape)
        except RuntimeError:  # e.g. a non-contiguous field
            view = None
        if view is not None and (view.dtype, view.device) == (ours.dtype, ours.device):
            bound.set(key, view)
        else:
            binding.write_backs.append(WriteBack(destination, ours, conversions.get(key)))
    return binding


def bind_torchrl_storage(carrier: TensorDictBase, storage: object) -> StorageBinding:
    """Bind a TorchRL-layout storage: every entry the collector writes, under its own key.

    Keys the storage lacks are added to it, zero-filled; nothing changes when an entry is
    refused.

    Raises:
        TypeError: `storage` is not a TensorDict.
        ValueError: its batch size is not the collector's `[*B, T + 1]`, or one of its
            entries has another shape than the collector writes there (naming it).
    """
    rollout = _check_batch(carrier, storage)
    present = rollout.keys(include_nested=True)
    tensor_keys = _tensor_keys(carrier)
    for key in tensor_keys:  # check everything before changing anything
        if key not in present:
            continue
        ours, theirs = carrier.get(key), rollout.get(key)
        if not isinstance(theirs, torch.Tensor) or theirs.shape != ours.shape:
            raise ValueError(
                f"the rollout storage's {key!r} is {_describe(theirs)}; this collector "
                f"writes {_describe(ours)} there. Allocate the storage from a frame of this "
                "env and policy."
            )
    for key in tensor_keys:
        if key not in present:
            rollout.set(key, torch.zeros_like(carrier.get(key)))
    return _bound(carrier, {key: rollout.get(key) for key in tensor_keys})


def _check_field(
    key: NestedKey, ours: torch.Tensor, theirs: object, name: str, batch_dims: int
) -> torch.Tensor:
    """The buffer field `theirs` (called `name`), refused unless it can hold the collector's
    entry `ours` (at `key`): the same batch `[*B, T + 1]`, as many numbers per step."""
    per_step = ours.shape[batch_dims:].numel()
    if (
        isinstance(theirs, torch.Tensor)
        and theirs.shape[:batch_dims] == ours.shape[:batch_dims]
        and theirs.shape[batch_dims:].numel() == per_step
    ):
        return theirs
    fix = (
        f"allocate it with {name}_dim={per_step}"
        if name in ("obs", "action")
        else "allocate the rollout with RolloutBuffer(num_envs, rollout_len, obs_dim, action_dim)"
    )
    raise ValueError(
        f"the rollout's {name!r} is {_describe(theirs)}; this collector writes {key!r} there as "
        f"{_describe(ours)}, {per_step} number(s) per step: {fix}."
    )


def _check_discrete_action(
    ours: torch.Tensor, theirs: object, batch_dims: int, action: DiscreteAction
) -> tuple[torch.Tensor, Convert | None]:
    """The `action` field `theirs` and how the collector's discrete action `ours` becomes
    it, refused unless it holds the action's indices or its one-hot."""
    if (
        isinstance(theirs, torch.Tensor)
        and theirs.shape[:batch_dims] == ours.shape[:batch_dims]
        and action.fits(theirs.shape[batch_dims:].numel())
    ):
        return theirs, action.conversion(theirs.shape[batch_dims:].numel())
    raise ValueError(
        f"the rollout's {ACTION!r} is {_describe(theirs)}; this collector writes "
        f"{keys.ACTION!r} there as {_describe(ours)}, {action.describe()}: allocate it with "
        f"{action.accepted('action_dim')}."
    )


def bind_buffer_storage(
    carrier: TensorDictBase, storage: object, action: DiscreteAction | None = None
) -> StorageBinding:
    """Bind a buffer-layout storage (`obs`, `action`, `value`, ...): each field the collector
    has an entry for is written through that entry; the storage gets no new field.

    Args:
        carrier: the collector's own carrier.
        storage: the user's rollout.
        action: the env's discrete action, if it has one: the `action` field then holds its
            indices or its one-hot, whichever it is allocated for.

    Raises:
        TypeError: `storage` is not a TensorDict.
        ValueError: its batch size is not the collector's `[*B, T + 1]`, the env observes no
            `"observation"`, or a field cannot hold the collector's entry (naming both).
    """
    rollout = _check_batch(carrier, storage)
    tensor_keys = _tensor_keys(carrier)
    if keys.OBSERVATION not in tensor_keys:
        observed = [key for key in tensor_keys if isinstance(key, str)]
        raise ValueError(
            f"the buffer layout's {OBS!r} holds the env's 'observation'; this collector's root "
            f"entries are {observed}. Flatten the observations into one 'observation' (e.g. "
            "with a transform), or use the TorchRL layout (RolloutBuffer(num_envs, "
            "rollout_len, spec_or_example=...))."
        )
    destinations: dict[NestedKey, torch.Tensor] = {}
    conversions: dict[NestedKey, Convert] = {}
    for key in tensor_keys:  # check everything before binding anything
        rollout_field = field_of_key(key)
        entry = None if rollout_field is None else rollout.get(rollout_field.name, None)
        if rollout_field is None or entry is None:
            continue  # an entry of the collector's own, or a field the rollout leaves out
        ours, batch_dims = carrier.get(key), carrier.batch_dims
        if rollout_field.name == ACTION and action is not None and action.is_written_by(ours):
            destinations[key], convert = _check_discrete_action(ours, entry, batch_dims, action)
            if convert is not None:
                conversions[key] = convert
        else:
            destinations[key] = _check_field(key, ours, entry, rollout_field.name, batch_dims)
    return _bound(carrier, destinations, conversions)

"""Weight sync schemes: how new policy weights travel from a collector to its worker processes.

A multi-process collector validates the weights, picks the version, sends one `UPDATE` command
per worker and waits for every acknowledgement; a scheme only decides how the tensors travel.
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

Weights = dict[str, torch.Tensor]
POLICY_MODEL_ID = "policy"


class WeightSyncScheme(ABC):
    """The contract between a collector (the sender) and its workers (the receivers).

    Sender, in the parent:
        - `connect(template, num_workers)` runs once, before any worker starts; `template` holds
          the policy's weights (names, shapes, dtypes) as a flat state dict.
        - `channel(worker)` is what that worker is given when it starts. It travels with
          multiprocessing's pickler, so shared-memory tensors arrive as handles, not copies.
        - `pack(weights)` runs once per update with weights already validated against the
          template and detached; it returns the bytes every worker's `UPDATE` message carries.

    Receiver, in a worker, when its `UPDATE` command arrives (always between two batches):
        - `unpack(channel, payload)` returns the weights to load, or None for "nothing to
          load". The worker copies them into its own policy (never runs on what `unpack`
          returns, which may be shared with the parent), forwards them to its own workers if it
          has any, and only then acknowledges. The sender returns when every worker of the
          tree has acknowledged.

    A worker's policy never shares storage with the parent's parameters, whatever the scheme.
    """

    def connect(self, template: Weights, num_workers: int) -> None:  # noqa: B027
        """Prepare the sender side for `num_workers` workers (nothing, by default)."""

    def channel(self, worker: int) -> Any:
        """What worker `worker` is handed at start (None by default)."""
        return None

    def close(self) -> None:  # noqa: B027
        """Release what `connect` made, once the workers are gone (nothing, by default)."""

    @abstractmethod
    def pack(self, weights: Weights) -> bytes:
        """The payload of one update, sent to every worker."""

    @staticmethod
    @abstractmethod
    def unpack(channel: Any, payload: bytes) -> Weights | None:
        """In a worker: the weights an update carries."""

    @property
    def sends_weights(self) -> bool:
        """Whether `update_policy_weights_` reaches the workers at all."""
        return True


class SharedMemWeightSyncScheme(WeightSyncScheme):
    """Weights travel through one shared-memory copy that every worker maps.

    The copy is the parent's own (never the trainer's parameters), written by `pack`; each
    worker copies it into its policy when told to, so an update costs one memory copy in the
    parent and one per worker, and the pipe carries only a few bytes. The default of the
    multi-process collectors for `nn.Module` policies.
    """

    def __init__(self) -> None:
        self._shared: TensorDict | None = None

    def connect(self, template: Weights, num_workers: int) -> None:
        if self._shared is not None:
            raise ValueError(
                "this SharedMemWeightSyncScheme already serves a collector; give each "
                "collector its own scheme instance."
            )
        shared = TensorDict(
            {name: tensor.detach().cpu().clone() for name, tensor in template.items()}
        )
        self._shared = shared.share_memory_()

    def channel(self, worker: int) -> Any:
        return self._shared

    def close(self) -> None:
        self._shared = None

    def __getstate__(self) -> dict[str, Any]:
        # A worker receives the copy through its channel; the sender's side stays here.
        return {"_shared": None}

    def pack(self, weights: Weights) -> bytes:
        if self._shared is None:
            raise RuntimeError("SharedMemWeightSyncScheme.pack() before connect().")
        for name, tensor in weights.items():
            self._shared[name].copy_(tensor)
        return b""

    @staticmethod
    def unpack(channel: Any, payload: bytes) -> Weights | None:
        return dict(channel.items())


class MultiProcessWeightSyncScheme(WeightSyncScheme):
    """Weights travel pickled through each worker's pipe (no shared memory needed)."""

    def pack(self, weights: Weights) -> bytes:
        return pickle.dumps({name: tensor.cpu() for name, tensor in weights.items()})

    @staticmethod
    def unpack(channel: Any, payload: bytes) -> Weights | None:
        return pickle.loads(payload)  # type: ignore[no-any-return]


class NoWeightSyncScheme(WeightSyncScheme):
    """Workers keep the weights they started with: `update_policy_weights_` sends nothing."""

    def pack(self, weights: Weights) -> bytes:
        return b""

    @staticmethod
    def unpack(channel: Any, payload: bytes) -> Weights | None:
        return None

    @property
    def sends_weights(self) -> bool:
        return False


def check_schemes(argument: str, schemes: Mapping[str, Any] | None) -> dict[str, WeightSyncScheme]:
    """Validate a `{model_id: scheme}` mapping; only the `"policy"` model exists today."""
    schemes = dict(schemes or {})
    for model_id, scheme in schemes.items():
        if model_id != POLICY_MODEL_ID:
            raise ValueError(
                f"{argument} has the model id {model_id!r}; the collector syncs one model, "
                f"{POLICY_MODEL_ID!r}. Use {{{POLICY_MODEL_ID!r}: scheme}}."
            )
        if not isinstance(scheme, WeightSyncScheme):
            raise TypeError(
                f"{argument}[{model_id!r}] must be a WeightSyncScheme (e.g. "
                f"SharedMemWeightSyncScheme()); got {type(scheme).__name__}."
            )
    return schemes


# --- weights: normalised and validated before anything is sent --------------------------------


def flat_weights(weights: Any) -> Weights:
    """A module, a state dict or a TensorDict of parameters, as a flat `{name: tensor}`."""
    if isinstance(weights, nn.Module):
        return dict(weights.state_dict())
    if isinstance(weights, TensorDictBase):
        return dict(weights.flatten_keys(".").items())
    if isinstance(weights, Mapping):
        return dict(weights)
    raise TypeError(
        "update_policy_weights_ takes an nn.Module, a state dict or a TensorDict of "
        f"parameters; got {type(weights).__name__}."
    )


def _align_prefix(names: set[str], template: set[str]) -> str | None:
    """The "module." prefix to add (or remove) so that `names` match a wrapped policy's."""
    for prefix in ("module.", "module.0.module."):
        if {prefix + name for name in names} == template:
            return "+" + prefix
        if {name.removeprefix(prefix) for name in names} == template:
            return "-" + prefix
    return None


def transient_names(policy: Any) -> frozenset[str]:
    """The names `TensorDict.from_module(policy)` has but its state dict lacks: buffers
    registered with `persistent=False`, which are no weights to send."""
    if not isinstance(policy, nn.Module):
        return frozenset()
    every = set(TensorDict.from_module(policy).flatten_keys(".").keys())
    return frozenset(every - set(policy.state_dict()))


def validated_weights(
    weights: Any, template: Weights, transient: frozenset[str] = frozenset()
) -> Weights:
    """`weights` checked against `template` (names, shapes, dtypes), detached, on CPU.

    The weights of the policy the collector was given may come as they are or as those of the
    plain module a `TensorDictModule` wraps (names without its `module.` prefix). Entries named
    in `transient` (non-persistent buffers, which `TensorDict.from_module` includes) are left
    out.

    Raises:
        ValueError: naming the missing or extra key, or the key of wrong shape or dtype.
    """
    flat = {name: value for name, value in flat_weights(weights).items() if name not in transient}
    if set(flat) != set(template):
        alignment = _align_prefix(set(flat), set(template))
        if alignment is not None:
            sign, prefix = alignment[0], alignment[1:]
            flat = {
                (prefix + name if sign == "+" else name.removeprefix(prefix)): tensor
                for name, tensor in flat.items()
            }
    missing, extra = sorted(set(template) - set(flat)), sorted(set(flat) - set(template))
    if missing or extra:
        raise ValueError(
            f"the weights do not match the policy: missing keys {missing}, unexpected keys "
            f"{extra}; expected the keys of the policy's state_dict(): {sorted(template)}."
        )
    checked: Weights = {}
    for name, expected in template.items():
        tensor = flat[name]
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"weights[{name!r}] is a {type(tensor).__name__}, not a tensor.")
        if tensor.shape != expected.shape or tensor.dtype != expected.dtype:
            raise ValueError(
                f"weights[{name!r}] has shape {tuple(tensor.shape)} and dtype {tensor.dtype}; "
                f"the policy's has shape {tuple(expected.shape)} and dtype {expected.dtype}."
            )
        checked[name] = tensor.detach()
    return checked

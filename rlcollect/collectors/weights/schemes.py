"""Weight sync schemes: how new policy weights travel from a collector to its worker processes.

A multi-process collector validates the weights, picks the version, sends one `UPDATE` command
per worker and waits for every acknowledgement (or, with `sync=False`, returns once it has sent
them); a scheme decides how the tensors travel and whether the sender waits.
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from tensordict import TensorDict

from rlcollect.collectors.policy.weights import Weights
from rlcollect.collectors.weights import torchrl_schemes

POLICY_MODEL_ID = "policy"
# Every scheme class by name, for TorchRL's backend names and scheme instances.
SCHEMES: dict[str, type[WeightSyncScheme]] = {}


class WeightSyncScheme(ABC):
    """The contract between a collector (the sender) and its workers (the receivers).

    Sender, in the parent:
        - `connect(template, num_workers)` runs once, before any worker starts; `template` holds
          the policy's weights (names, shapes, dtypes) as a flat state dict. A collector given
          only a policy factory connects a scheme that `needs_layout` at its first update
          instead, and sends each worker its `channel` then.
        - `channel(worker)` is what that worker is given when it starts. It travels with
          multiprocessing's pickler, so shared-memory tensors arrive as handles, not copies.
        - `pack(weights)` runs once per update with weights already validated against the
          template and detached; it returns the bytes every worker's `UPDATE` message carries.

    Receiver, in a worker, when its `UPDATE` command arrives (always between two batches):
        - `unpack(channel, payload)` returns the weights to load, or None for "nothing to
          load". The worker copies them into its own policy (never runs on what `unpack`
          returns, which may be shared with the parent), forwards them to its own workers if it
          has any, and only then acknowledges. The sender returns when every worker of the
          tree has acknowledged, or, when the scheme's `sync` is False (TorchRL's flag), as
          soon as the update is sent: each worker then loads it before its next batch, and
          the next update first waits for the acknowledgements of this one, so that no
          worker reads weights while they are rewritten.

    A worker's policy never shares storage with the parent's parameters, whatever the scheme.
    TorchRL's scheme API is accepted too: `from_backend`, `init_on_sender`, and TorchRL's own
    scheme instances in `weight_sync_schemes=` (see `weights/torchrl_schemes.py`).
    """

    # Whether `update_policy_weights_` waits for every worker's acknowledgement (TorchRL's
    # `sync`); the schemes that send weights take `sync=False`.
    sync: bool = True
    # Whether `connect` lays something out from the template: a collector with only a policy
    # factory (no weights known before its workers start) then connects at its first update,
    # with that update's weights, and hands the workers their channels (WEIGHT_CHANNEL).
    needs_layout: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        SCHEMES[cls.__name__] = cls

    @classmethod
    def from_backend(cls, backend: str, **kwargs: Any) -> WeightSyncScheme:
        """TorchRL's constructor by backend: `"none"` / `"direct"` -> `NoWeightSyncScheme`,
        `"shared"` / `"thread"` -> `SharedMemWeightSyncScheme`, `"process"` /
        `"multiprocessing"` -> `MultiProcessWeightSyncScheme`, `"ray"` ->
        `RayWeightSyncScheme`; TorchRL's `strategy=`, `sync=` and `per_worker_weights=`
        are accepted (`sync=False` by the shared-memory and pipe schemes).

        Raises:
            ValueError: `"distributed"` / `"rpc"` (naming the schemes to use instead), an
                unknown backend, or `sync=False` for a scheme that does not take it.
        """
        return torchrl_schemes.scheme_from_backend(SCHEMES, backend, **kwargs)  # type: ignore[no-any-return]

    def init_on_sender(self, *, model_id: str = POLICY_MODEL_ID, **context: Any) -> None:
        """TorchRL's sender-side set-up, accepted for scripts that call it: our collector
        connects its scheme itself when it is built, so this only checks the model id.

        Raises:
            ValueError: a model id other than `"policy"`.
        """
        check_model_id("init_on_sender(model_id=...)", model_id)
        self._initialized_on_sender = True

    @property
    def initialized_on_sender(self) -> bool:
        """Whether `init_on_sender` was called (TorchRL's flag)."""
        return bool(getattr(self, "_initialized_on_sender", False))

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

    `per_worker_weights` is TorchRL's flag, accepted either way: every worker always holds
    weights of its own here; `update_policy_weights_({0: weights_0, 1: weights_1})` gives
    each its own, and `update_policy_weights_(weights, worker_ids=...)` updates some only.
    `sync=False` (TorchRL's): an update returns once it is sent, without waiting for the
    workers to load it (see `WeightSyncScheme`).
    """

    needs_layout = True

    def __init__(self, per_worker_weights: bool = False, sync: bool = True) -> None:
        self._shared: TensorDict | None = None
        self.per_worker_weights = bool(per_worker_weights)
        self.sync = check_sync(sync)

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
        return {**self.__dict__, "_shared": None}

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
    """Weights travel pickled through each worker's pipe (no shared memory needed).

    `per_worker_weights` and `sync`: TorchRL's flags (see `SharedMemWeightSyncScheme`).
    """

    def __init__(self, per_worker_weights: bool = False, sync: bool = True) -> None:
        self.per_worker_weights = bool(per_worker_weights)
        self.sync = check_sync(sync)

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


def check_sync(sync: Any) -> bool:
    """TorchRL's `sync` flag: a bool."""
    if not isinstance(sync, bool):
        raise TypeError(
            f"sync must be True (an update waits for every worker) or False (it returns once "
            f"sent); got {sync!r}."
        )
    return sync


def check_model_id(argument: str, model_id: Any) -> None:
    if model_id != POLICY_MODEL_ID:
        raise ValueError(
            f"{argument} has the model id {model_id!r}; the collector syncs one model, "
            f"{POLICY_MODEL_ID!r}. Use {{{POLICY_MODEL_ID!r}: scheme}}."
        )


def check_schemes(
    argument: str, schemes: Mapping[str, Any] | None, other_models: bool = False
) -> dict[str, WeightSyncScheme]:
    """Validate a `{model_id: scheme}` mapping; TorchRL's scheme instances become ours.
    With `other_models` (the multi-process collectors), model ids other than `"policy"`
    (attribute paths, e.g. `"env.transform[0].module"`) are accepted, as TorchRL registers
    them: their weights travel pickled through each worker's pipe whatever the scheme."""
    schemes = dict(schemes or {})
    for model_id, scheme in schemes.items():
        if not (other_models and isinstance(model_id, str)):
            check_model_id(argument, model_id)
        if torchrl_schemes.is_torchrl_scheme(scheme):
            try:
                scheme = torchrl_schemes.from_torchrl_scheme(SCHEMES, scheme)
            except ValueError as err:
                raise ValueError(f"{argument}[{model_id!r}]: {err}") from err
            schemes[model_id] = scheme
        if not isinstance(scheme, WeightSyncScheme):
            raise TypeError(
                f"{argument}[{model_id!r}] must be a WeightSyncScheme (e.g. "
                f"SharedMemWeightSyncScheme()); got {type(scheme).__name__}."
            )
    return schemes

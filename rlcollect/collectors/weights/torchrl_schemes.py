"""TorchRL's weight-sync schemes, as ours: its backend names and its scheme instances.

TorchRL (`torchrl.weight_update`) names a scheme by its deployment backend and builds it with
`WeightSyncScheme.from_backend(backend, **kwargs)`; a TorchRL user also passes TorchRL's scheme
instances in `weight_sync_schemes=`. Both map onto our schemes, which carry weights the same
way (shared memory, pipes, Ray's object store, or not at all). By default an update waits
for every worker's acknowledgement (DESIGN's promise that no batch after an update comes from
old weights); TorchRL's `sync=False` is taken by the shared-memory and pipe schemes (the
update returns once sent) and refused by the others. TorchRL's `strategy` ("tensordict" or
"state_dict") is how TorchRL packs weights in transit, and ours take both forms from
`update_policy_weights_` whatever the scheme.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Our scheme classes by name (`schemes.SCHEMES`, which imports this module: not the reverse).
Registry = Mapping[str, type]

# TorchRL's backend names (and their aliases) -> the name of our scheme class.
BACKENDS = {
    "none": "NoWeightSyncScheme",
    "direct": "NoWeightSyncScheme",
    "shared": "SharedMemWeightSyncScheme",
    "thread": "SharedMemWeightSyncScheme",
    "process": "MultiProcessWeightSyncScheme",
    "multiprocessing": "MultiProcessWeightSyncScheme",
    "ray": "RayWeightSyncScheme",
}
# TorchRL's backends that carry weights over torch.distributed or RPC, which we do not.
REFUSED = {
    "distributed": "DistributedWeightSyncScheme",
    "rpc": "RPCWeightSyncScheme",
}
STRATEGIES = ("tensordict", "state_dict")
# Our schemes that take TorchRL's `per_worker_weights` and `sync`.
WORKER_SCHEMES = ("SharedMemWeightSyncScheme", "MultiProcessWeightSyncScheme")


def scheme_from_backend(registry: Registry, backend: Any, **kwargs: Any) -> Any:
    """Our scheme for TorchRL's `backend` name, with TorchRL's keyword arguments checked.

    Raises:
        ValueError: a backend we do not serve (naming ours), `sync=False` for a scheme that
            does not take it, an unknown `strategy`.
        TypeError: a keyword argument the scheme does not take.
    """
    if backend in REFUSED:
        raise ValueError(
            f"weight-sync backend {backend!r} (TorchRL's {REFUSED[backend]}) is not supported: "
            "rlcollect's collectors run in worker processes or Ray actors, not over "
            "torch.distributed or RPC. Use 'shared' or 'process' (SharedMemWeightSyncScheme, "
            "MultiProcessWeightSyncScheme) for MultiSyncCollector / MultiAsyncCollector, or "
            "'ray' (RayWeightSyncScheme) for RayCollector."
        )
    if backend not in BACKENDS:
        raise ValueError(
            f"Unsupported weight-sync backend {backend!r}; expected one of {sorted(BACKENDS)}."
        )
    cls = registry[BACKENDS[backend]]
    return cls(**torchrl_options(cls, kwargs))


def torchrl_options(cls: type, options: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of our `cls` out of TorchRL's for the same scheme: `strategy`
    accepted (it changes nothing here), `per_worker_weights` and `sync` kept where the scheme
    takes them (`sync=True`, the default, accepted by every scheme)."""
    options = dict(options)
    strategy = options.pop("strategy", "tensordict")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}; expected one of {list(STRATEGIES)}.")
    takes = {"per_worker_weights", "sync"} if cls.__name__ in WORKER_SCHEMES else set()
    if "sync" not in takes and options.pop("sync", True) is not True:
        raise ValueError(
            f"sync=False is not supported by {cls.__name__}: its update returns once every "
            "worker has applied the weights. SharedMemWeightSyncScheme and "
            "MultiProcessWeightSyncScheme take sync=False (the update returns once sent)."
        )
    unknown = sorted(set(options) - takes)
    if unknown:
        raise TypeError(
            f"{cls.__name__} takes no argument {unknown}; it accepts strategy=, sync=True"
            + (", sync=False and per_worker_weights=." if takes else ".")
        )
    return options


def is_torchrl_scheme(scheme: Any) -> bool:
    return any(c.__module__.startswith("torchrl.weight_update") for c in type(scheme).__mro__[:-1])


def from_torchrl_scheme(registry: Registry, scheme: Any) -> Any:
    """Our scheme for one of TorchRL's scheme instances (not yet initialised by a TorchRL
    collector), carrying its `per_worker_weights`.

    Raises:
        ValueError: a TorchRL scheme with no counterpart here, naming ours to use.
    """
    for cls in type(scheme).__mro__:
        if cls.__name__ in REFUSED.values():
            backend = next(key for key, value in REFUSED.items() if value == cls.__name__)
            return scheme_from_backend(registry, backend)
        if cls.__name__ in BACKENDS.values() and cls.__module__.startswith("torchrl."):
            ours = registry[cls.__name__]
            options: dict[str, Any] = {"sync": bool(getattr(scheme, "sync", True))}
            if ours.__name__ in WORKER_SCHEMES:
                options["per_worker_weights"] = bool(getattr(scheme, "per_worker_weights", False))
            return ours(**torchrl_options(ours, options))
    raise ValueError(
        f"TorchRL's {type(scheme).__name__} has no counterpart in rlcollect; use "
        "SharedMemWeightSyncScheme(), MultiProcessWeightSyncScheme() or NoWeightSyncScheme() "
        "(multi-process collectors), or RayWeightSyncScheme() (RayCollector)."
    )

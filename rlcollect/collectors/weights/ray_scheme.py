"""`RayWeightSyncScheme`: policy weights travel to Ray actors through Ray's object store."""

from __future__ import annotations

from typing import Any

from rlcollect.collectors.policy.weights import Weights
from rlcollect.collectors.weights.schemes import WeightSyncScheme
from rlcollect.errors import MisuseError
from rlcollect.runtime.ray_lease import require_ray


class RayWeightSyncScheme(WeightSyncScheme):
    """Weights are put into Ray's object store once per update; every actor reads that copy.

    The `RayCollector` validates the weights against the policy's (names, shapes, dtypes)
    before anything is sent, then `publish` puts one CPU copy of them into the object store
    and every actor is handed the same reference. An actor loads them into its own policy
    between two batches (pausing its background collection for it), forwards them to its
    worker processes when it runs a multi-process collector, and only then acknowledges; the
    update returns once every actor has, or raises naming the actors that did not. The object
    store holds a serialized copy, so no actor's weights alias the trainer's parameters. The
    last published reference is kept, so that a restarted actor gets the current weights.

    This scheme carries weights to Ray actors only; a multi-process collector's worker
    processes take `SharedMemWeightSyncScheme` or `MultiProcessWeightSyncScheme` (an actor's
    `MultiSyncCollector` picks its own, see `collector_kwargs`).

    Examples:
        >>> import ray
        >>> import torch
        >>> from rlcollect.collectors import RayWeightSyncScheme
        >>> from rlcollect.runtime.ray_lease import RayLease
        >>> lease = RayLease.acquire({"num_cpus": 1, "include_dashboard": False})
        >>> scheme = RayWeightSyncScheme()
        >>> scheme.connect({"weight": torch.zeros(2)}, num_workers=2)
        >>> reference = scheme.publish({"weight": torch.ones(2)})  # one ray.put per update
        >>> ray.get(reference)["weight"].tolist()  # what every actor is handed
        [1.0, 1.0]
        >>> scheme.close()
        >>> lease.release()
    """

    def __init__(self) -> None:
        self._reference: Any = None
        self._connected = False

    def connect(self, template: Weights, num_workers: int) -> None:
        if self._connected:
            raise ValueError(
                "this RayWeightSyncScheme already serves a collector; give each collector its "
                "own scheme instance."
            )
        self._connected = True

    def publish(self, weights: Weights) -> Any:
        """Put validated weights into the object store, once, and return the reference that
        every actor is handed (Ray resolves it to the weights in the actor)."""
        ray = require_ray("RayWeightSyncScheme")
        copy = {name: tensor.detach().cpu().contiguous() for name, tensor in weights.items()}
        self._reference = ray.put(copy)
        return self._reference

    @property
    def current(self) -> Any:
        """The reference of the last published weights (None before the first update)."""
        return self._reference

    def close(self) -> None:
        self._reference = None
        self._connected = False

    def pack(self, weights: Weights) -> bytes:
        raise MisuseError(
            "RayWeightSyncScheme carries weights to RayCollector's actors; a multi-process "
            "collector's workers need SharedMemWeightSyncScheme() or "
            "MultiProcessWeightSyncScheme()."
        )

    @staticmethod
    def unpack(channel: Any, payload: bytes) -> Weights | None:
        raise MisuseError(
            "RayWeightSyncScheme weights reach Ray actors as object-store references, not "
            "through a worker pipe; use it with RayCollector only."
        )

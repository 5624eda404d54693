"""TorchRL's legacy `weight_updater=`: a `WeightUpdaterBase` that carries weights itself.

Before weight-sync schemes, a TorchRL collector took a `WeightUpdaterBase` (or a callable
that builds one): the collector registers itself with it (`register_collector`), and
`update_policy_weights_(weights, worker_ids=...)` hands the update to it (`updater(
policy_or_weights=..., worker_ids=...)`), which reads the server's weights, maps them and
syncs them with each worker in its own way. TorchRL's own code still passes one (its LLM
collectors), and users wrote their own. We take it as TorchRL does: the updater is the update
path. An updater reaches the policy or the workers through the collector's public calls;
`update_policy_weights_` called from inside the updater is our own path (checked weights,
acknowledged by every worker), so an updater's `_sync_weights_with_worker(worker_id,
server_weights)` can be `self.collector.update_policy_weights_(server_weights,
worker_ids=worker_id)`.
"""

from __future__ import annotations

from typing import Any


def is_weight_updater(value: Any) -> bool:
    """Whether `value` has what a collector calls on a TorchRL weight updater."""
    return callable(value) and callable(getattr(value, "register_collector", None))


def check_weight_updater(weight_updater: Any) -> Any:
    """`weight_updater=` as TorchRL takes it: None, an updater, or a callable with no
    argument that builds one (called here, once).

    Raises:
        TypeError: anything else, or a callable whose result is not an updater.
    """
    if weight_updater is None or is_weight_updater(weight_updater):
        return weight_updater
    if callable(weight_updater):
        built = weight_updater()
        if is_weight_updater(built):
            return built
        weight_updater = built
    raise TypeError(
        "weight_updater must be a TorchRL WeightUpdaterBase (an object with "
        "register_collector() that is called with policy_or_weights= and worker_ids=), or a "
        f"callable with no argument that builds one; got {type(weight_updater).__name__}. "
        "For the usual cases use weight_sync_schemes={'policy': scheme} instead."
    )


def register(weight_updater: Any, collector: Any) -> Any:
    """Register `collector` with a checked updater, as TorchRL's collectors do.

    Raises:
        RuntimeError: the updater does not name `collector` as its collector afterwards.
    """
    if weight_updater is None:
        return None
    weight_updater.register_collector(collector)
    try:
        registered = weight_updater.collector
    except (AttributeError, ValueError):  # no such property, or one shared by collectors
        registered = collector
    if registered is not None and registered is not collector:
        raise RuntimeError(
            f"weight_updater {type(weight_updater).__name__} did not register "
            f"{type(collector).__name__}: its collector is {type(registered).__name__}."
        )
    return weight_updater

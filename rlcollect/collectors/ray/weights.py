"""`ActorWeights`: the policy weights a RayCollector sends its actors, and when.

It holds what updates are checked against (the policy's names, shapes and dtypes), the scheme
that carries them, and how many batches each actor collected since its weights were last sent,
so that the collector can refresh overdue actors (`max_weight_update_interval`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlcollect.collectors.ray.fleet import ActorFleet, ActorSlot
from rlcollect.collectors.ray.options import choose_scheme
from rlcollect.collectors.weights.ray_scheme import RayWeightSyncScheme
from rlcollect.collectors.weights.schemes import (
    NoWeightSyncScheme,
    Weights,
)
from rlcollect.collectors.weights.sender import CHILD_TIMEOUT_SHARE, SentWeights


class ActorWeights:
    """The weights side of a RayCollector of `num` actors.

    Args:
        policy: the policy the collector was given (None with random actions or a factory).
        policy_factory: the first actor's policy factory, when there is no `policy`.
        weight_sync_schemes: the collector's `weight_sync_schemes` argument.
        num: the number of actors.
    """

    def __init__(
        self,
        policy: Any,
        policy_factory: Callable[[], Any] | None,
        weight_sync_schemes: Mapping[str, Any] | None,
        num: int,
    ) -> None:
        self.sent = SentWeights(policy, policy_factory)
        if weight_sync_schemes or self.sent.template:
            self.scheme = choose_scheme(weight_sync_schemes)
        else:
            self.scheme = NoWeightSyncScheme()
        self.scheme.connect(self.sent.template, num)
        self.stale = [0] * num  # batches each actor collected since its weights were sent

    def checked(self, source: Any, policy_id: str | None = None) -> Weights:
        """See `SentWeights.checked`."""
        return self.sent.checked(source, policy_id)

    def send(
        self,
        fleet: ActorFleet,
        slots: Sequence[ActorSlot],
        weights: Weights,
        version: int,
        timeout: float,
    ) -> None:
        """Put `weights` into the object store once, have every actor of `slots` apply them as
        `version` between two batches, and wait for every acknowledgement (`timeout` seconds;
        an actor's own workers get a share of it)."""
        if not isinstance(self.scheme, RayWeightSyncScheme):
            return
        reference = self.scheme.publish(weights)
        self.sent.record(weights)
        child_timeout = timeout * CHILD_TIMEOUT_SHARE
        fleet.call(slots, "apply_weights", reference, version, child_timeout, timeout=timeout)
        for slot in slots:
            slot.policy_version = version
            self.stale[slot.index] = 0

    def overdue(self, slots: Sequence[ActorSlot], interval: int) -> list[int]:
        """The actors of `slots` that collected more than `interval` batches since their weights
        were sent (none when the interval is -1 or there is no policy to read weights from)."""
        if interval < 0 or not self.sent.readable:
            return []
        return [slot.index for slot in slots if self.stale[slot.index] > interval]

    @property
    def current(self) -> Any:
        """The object-store reference of the last weights sent, for a restarted actor (None
        before the first update: it builds the policy it was given)."""
        return self.scheme.current if isinstance(self.scheme, RayWeightSyncScheme) else None

    def close(self) -> None:
        self.scheme.close()

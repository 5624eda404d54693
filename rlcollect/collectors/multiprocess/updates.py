"""`WeightDelivery`: policy weights to a pool's workers, without waiting behind a batch.

A worker answers one command at a time, so an update sent to a worker busy with a batch would
be read, and acknowledged, only once that batch is done: the sender would wait a whole round. A
busy worker's update is held here instead and sent before the next command the worker gets (its
next batch, first of all); an idle worker's is sent at once (and, with a `sync` scheme,
acknowledged before the update returns). Either way no batch the worker starts after the update
runs older weights.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlcollect.collectors.multiprocess.pool import WorkerPool, WorkerSlot
from rlcollect.collectors.multiprocess.worker import WorkerCommand
from rlcollect.collectors.policy.weights import Weights
from rlcollect.collectors.weights.schemes import WeightSyncScheme
from rlcollect.collectors.weights.sender import CHILD_TIMEOUT_SHARE


@dataclass(frozen=True)
class HeldUpdate:
    """An update waiting for a busy worker: validated weights (a copy of their own, never
    changed), their version and the update's timeout."""

    weights: Weights
    version: int
    timeout: float


class WeightDelivery:
    """Sends policy updates to a pool's workers through `scheme`.

    Args:
        pool: the workers; their held updates go out before any other command (`post`,
            `launch`, `start_background` call `send_held`).
        scheme: packs the weights (a shared copy every worker reads, or pickled bytes).
        prepare: called with the weights and timeout before each pack (the collector lays out
            a scheme it could not connect before its first update).
    """

    def __init__(
        self,
        pool: WorkerPool,
        scheme: WeightSyncScheme,
        prepare: Callable[[Weights, float], None],
    ) -> None:
        self.pool = pool
        self.scheme = scheme
        self.prepare = prepare
        # The weights the scheme's copy holds now, and their payload: held updates of one
        # update, flushed worker by worker, are packed once.
        self._packed: tuple[Weights, bytes] | None = None
        pool.before_command = self.send_held

    def deliver(self, slots: Sequence[WorkerSlot], update: HeldUpdate) -> None:
        """Send `update` to the idle workers of `slots` (waiting for their acknowledgements
        when the scheme is `sync`) and hold it for those collecting a batch."""
        with self.pool.lock:
            idle = []
            for slot in slots:
                if WorkerCommand.COLLECT in slot.pending:
                    slot.held_update = update  # a later update supersedes an older one
                else:
                    slot.held_update = None
                    idle.append(slot)
            if idle:
                self._send(idle, update, wait=self.scheme.sync)
            for slot in slots:
                slot.policy_version = update.version

    def send_held(self, slots: Sequence[WorkerSlot]) -> None:
        """Send the updates held for `slots` (without waiting: the worker reads its update
        before the command that follows it, whose answer brings the acknowledgement first)."""
        held: dict[int, tuple[HeldUpdate, list[WorkerSlot]]] = {}
        for slot in slots:
            update, slot.held_update = slot.held_update, None
            if update is not None:
                held.setdefault(id(update), (update, []))[1].append(slot)
        for update, group in held.values():
            self._send(group, update, wait=False)

    def _send(self, slots: Sequence[WorkerSlot], update: HeldUpdate, wait: bool) -> None:
        payload = self._payload(update)
        message = pickle.dumps((update.timeout * CHILD_TIMEOUT_SHARE, payload))
        command = WorkerCommand.UPDATE_WEIGHTS
        if wait:
            self.pool.request(slots, command, update.version, message, update.timeout)
        else:
            self.pool.post(slots, command, update.version, message)

    def _payload(self, update: HeldUpdate) -> bytes:
        self.prepare(update.weights, update.timeout)
        packed = self._packed
        if packed is not None and packed[0] is update.weights:
            return packed[1]
        # No worker may read the scheme's copy while it is rewritten: every update sent
        # before is acknowledged first (quick: each went ahead of its worker's next batch).
        self.pool.settle(WorkerCommand.UPDATE_WEIGHTS, update.timeout)
        payload = self.scheme.pack(update.weights)
        self._packed = (update.weights, payload)
        return payload

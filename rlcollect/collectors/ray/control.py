"""The Ray collector's controls between batches: seeding, resets, checkpoints and statistics,
each a call to every actor.

`RayCollectorControl` holds them; `RayCollector` (collector.py) holds the actors' start,
the gathering of their batches, weights and background writing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rlcollect.collectors.children import (
    CollectorWithChildren,
    WorkerView,
    check_seed,
    check_worker_view,
    children_states,
    chosen_children,
    episode_statistics,
    unpack_env_attribute,
    worker_view,
)
from rlcollect.collectors.ray.background import BackgroundWriting
from rlcollect.collectors.ray.fleet import ActorFleet
from rlcollect.errors import MisuseError


class RayCollectorControl(CollectorWithChildren):
    """Seeding, resets, checkpoints and statistics of a `RayCollector` (see there)."""

    # Set by `RayCollector.__init__`.
    fleet: ActorFleet
    background: BackgroundWriting
    num_collectors: int
    iterations: int
    policy_version: int
    total_frames: int
    frames_per_batch: int
    _frames: int
    _seeds: list[int | None]
    _start_time: float | None
    _final: tuple[dict[str, Any], dict[str, Any]] | None

    def _check_open(self) -> None:
        if not self.fleet.is_open:
            raise MisuseError("the collector is shut down; build a new one.")

    def _check_idle(self, action: str) -> None:
        if self.background.is_busy:
            raise MisuseError(
                f"{action} cannot run while the actors fill the buffer in the background; "
                "call it inside `with collector.pause():` or after async_shutdown()."
            )

    # --- state and control ----------------------------------------------------------------------

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed the actors in a chain (actor i + 1 gets what actor i returns), so every actor is
        seeded apart and the same seed gives the same batches; returns the next seed. With
        `static_seed` (TorchRL's), every actor gets `seed`, which is returned."""
        self._check_open()
        self._check_idle("set_seed()")
        seed = first = check_seed(seed)
        for slot in self.fleet.slots:
            own = self._seeds[slot.index] = first if static_seed else seed
            (seed,) = self.fleet.call([slot], "set_seed", own, fatal=False)
        return first if static_seed else seed

    def reset(self, index: Any = None) -> None:
        """Every actor (or those `index` names: one index, a list, or TorchRL's one bool per
        actor) starts new trajectories at its next batch."""
        self._check_open()
        self._check_idle("reset()")
        chosen = chosen_children(index, self.num_collectors, "actor")
        self.fleet.call([self.fleet.slots[i] for i in chosen], "reset", fatal=False)

    def getattr_env(self, attr: str) -> Any:
        """An attribute of the first actor's env (as TorchRL's multi-process collectors'
        `getattr_env` reads the first worker's).

        Raises:
            AttributeError: that env has no attribute `attr`.
        """
        self._check_open()
        (answer,) = self.fleet.call([self.fleet.slots[0]], "getattr_env", attr, fatal=False)
        return unpack_env_attribute(answer, attr)

    def _policy_model(self) -> Any:
        return self.weights.sent.policy

    def state_dict(self) -> dict[str, Any]:
        """Counters, the policy version and every actor's collector state (after
        `async_shutdown()`, the state it ended with)."""
        if self._final is not None and not self.fleet.is_open:
            return self._final[0]
        self._check_open()
        states = self.fleet.call(self.fleet.slots, "state_dict", fatal=False)
        return {
            "frames": self.frames,
            "iterations": self.iterations,
            "policy_version": self.policy_version,
            "collectors": states,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume from `state_dict()`, actor by actor (a later restart starts from the weights
        of the last `update_policy_weights_`)."""
        self._check_open()
        self._check_idle("load_state_dict()")
        state = state_dict
        states = children_states(state, "collectors", self.num_collectors)
        calls = [
            self.fleet.submit(slot, "load_state_dict", own, fatal=False)
            for slot, own in zip(self.fleet.slots, states, strict=True)
        ]
        self.fleet.gather(calls)
        self._frames = int(state["frames"])
        self.iterations = int(state["iterations"])
        self.policy_version = int(state["policy_version"])

    def stats(self, workers: WorkerView = "aggregate") -> dict[str, Any]:
        """Frames, batches, frames/s, the policy version, episode statistics over all actors,
        `"workers"` / `"workers_alive"` / `"worker_frames"` (TorchRL's counts: an actor Ray
        restarts is restored before it answers, so every actor counts as alive) and, under
        `"collectors"`, per actor: its node, pid, frames, restarts, policy version and
        collector stats. `workers="per_worker"` or `"both"` add each actor's scalars as
        `"worker_<i>/<name>"` (TorchRL's views). After `async_shutdown()`, those it ended
        with."""
        view = check_worker_view(workers)
        if self._final is not None and not self.fleet.is_open:
            final = self._final[1]
            return worker_view(final, final["collectors"], view)
        self._check_open()
        replies = self.fleet.call(self.fleet.slots, "stats", fatal=False)
        frames = self.frames
        elapsed = time.perf_counter() - self._start_time if self._start_time else 0.0
        actors = [
            {
                "node_id": slot.node_id,
                "pid": slot.pid,
                "frames": int(reply["frames"]),
                "restarts": slot.restarts,
                "policy_version": slot.policy_version,
                "collector": reply,
            }
            for slot, reply in zip(self.fleet.slots, replies, strict=True)
        ]
        aggregate = {
            "frames": frames,
            "total_frames": self.total_frames,
            "batches": self.iterations,
            "completed": 0 < self.total_frames <= frames,
            "requested_frames_per_batch": self.frames_per_batch,
            "frames_per_second": frames / elapsed if elapsed > 0 else 0.0,
            "policy_version": self.policy_version,
            **episode_statistics(replies),
            "weight_update_seconds": self.weight_update_seconds,
            "workers": len(actors),
            "workers_alive": len(actors),
            "worker_frames": sum(actor["frames"] for actor in actors),
            "collectors": actors,
        }
        return worker_view(aggregate, actors, view)

    def process_ids(self) -> list[int]:
        """Every actor's process id, and those of the worker processes below them."""
        self._check_open()
        return self.fleet.process_ids()

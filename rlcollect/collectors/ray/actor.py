"""`CollectorActor`: one collector served inside a Ray actor (the remote side of RayCollector).

Ray runs an actor's methods one at a time, so everything the driver asks (new weights, a seed,
a state) happens between two batches. With a replay buffer, the actor extends it itself: in
`collect()`, or batch after batch in a background thread after `start()`, which every other
method pauses between batches.
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase

from rlcollect.collectors.children import EnvAttribute, env_attribute
from rlcollect.collectors.single.background import BackgroundLoop
from rlcollect.errors import MisuseError
from rlcollect.runtime.ray_lease import require_ray


class NeedsRestoreError(RuntimeError):
    """A restarted actor was asked to collect before the driver gave it back its state (the
    current weights, trajectory ids of its own and a seed)."""


@dataclass
class ActorSpec:
    """What one actor builds: its collector and where its batches go."""

    collector_class: Callable[..., Any]
    create_env_fn: Any
    policy_factory: Callable[[], Any] | None
    frames_per_batch: int
    collector_kwargs: dict[str, Any]
    trajectory_ids: tuple[int, int]
    index: int
    replay_buffer: Any = None  # a picklable client of a Ray-served buffer
    writer: str = ""  # the name its writes go under (see `writer_name`), unique per collector


def writer_name(spec: ActorSpec, incarnation: int) -> str:
    """The name under which the actor's `incarnation`-th process (0: the first, k: after k
    restarts) extends the buffer, so that the driver can ask the buffer what a process that
    died wrote after it last reported."""
    return f"{spec.writer}/{spec.index}/{incarnation}"


class CollectorActor:
    """Builds one collector (a `Collector`, or a multi-process collector whose workers run on
    this actor's node) and answers the driver's calls with it.

    A build error is kept and raised by `ready()`, so that the driver reports it with its
    traceback. An actor that Ray restarted refuses to collect until `restore()`.
    """

    def __init__(self, spec: ActorSpec, policy: Any) -> None:
        ray = require_ray("CollectorActor")
        # Ray hands NumPy arrays over read-only from its object store: own copies instead.
        spec, policy = copy.deepcopy((spec, policy))
        self.spec = spec
        context = ray.get_runtime_context()
        with warnings.catch_warnings():  # Ray reads its own deprecated actor_id there
            warnings.simplefilter("ignore")
            self.restored = not context.was_current_actor_reconstructed
        self.node_id = context.get_node_id()
        self.writer = writer_name(spec, 0)  # a restarted actor learns its own in restore()
        self.collector: Any = None
        self.build_error: BaseException | None = None
        try:
            self.collector = self._build(policy)
        except BaseException as err:  # reported by ready(), with the traceback
            self.build_error = err
        self.loop = BackgroundLoop(self._write_batch, name=f"rlcollect-ray-actor-{spec.index}")
        self.paused = contextlib.ExitStack()
        self.share = 0  # frames to write in the background (0: no limit)
        self.written = 0  # frames written since start()
        self.collect_seconds = 0.0

    def _build(self, policy: Any) -> Any:
        spec = self.spec
        kwargs = dict(spec.collector_kwargs)
        if spec.policy_factory is not None:
            kwargs["policy_factory"] = spec.policy_factory  # built where it runs
        collector = spec.collector_class(
            spec.create_env_fn,
            policy,
            frames_per_batch=spec.frames_per_batch,
            total_frames=-1,  # the driver decides when to stop
            **kwargs,
        )
        collector.assign_trajectory_ids(*spec.trajectory_ids)
        return collector

    # --- life cycle -----------------------------------------------------------------------------

    def ready(self) -> dict[str, Any]:
        """What the driver needs once the actor is up (or the error that building raised)."""
        if self.build_error is not None:
            raise self.build_error
        return {
            "frames_per_batch": int(self.collector.frames_per_batch),
            "pid": os.getpid(),
            "node_id": self.node_id,
            "restored": self.restored,
        }

    def restore(
        self,
        weights: Any,
        version: int,
        trajectory_ids: tuple[int, int],
        seed: int | None,
        incarnation: int,
    ) -> None:
        """After a restart: the current weights, fresh trajectory ids, a seed moved on, and
        the name its writes go under from now on."""
        self.writer = writer_name(self.spec, incarnation)
        self.collector.assign_trajectory_ids(*trajectory_ids)
        if weights is not None:
            self.collector.apply_weights(weights, version, None)
        if seed is not None:
            torch.manual_seed(seed)
            self.collector.set_seed(seed)
        self.restored = True

    def _check_restored(self) -> None:
        if not self.restored:
            raise NeedsRestoreError(
                f"collector actor {self.spec.index} was restarted by Ray and has not been "
                "restored yet."
            )

    def close(self) -> None:
        """Stop background collection and shut the collector down (its workers too)."""
        with contextlib.suppress(Exception):
            self.loop.shutdown(timeout=5.0)
        with contextlib.suppress(Exception):
            self.paused.close()
        if self.collector is not None:
            self.collector.shutdown()

    # --- batches --------------------------------------------------------------------------------

    def collect(self) -> tuple[TensorDictBase | None, dict[str, Any]]:
        """One batch and what the driver counts (frames, policy version, seconds); with a
        replay buffer, the batch is written to it and None comes back."""
        self._check_restored()
        batch, frames, seconds = self._next_batch()
        if self.spec.replay_buffer is not None:
            self._extend(batch)
            batch = None
        version = int(getattr(self.collector, "policy_version", 0))
        return batch, {"frames": frames, "version": version, "seconds": seconds}

    def _next_batch(self) -> tuple[TensorDictBase, int, float]:
        start, before = time.perf_counter(), int(self.collector.frames)
        batch = self.collector.next()
        seconds = time.perf_counter() - start
        self.collect_seconds += seconds
        return batch, int(self.collector.frames) - before, seconds

    def _extend(self, batch: TensorDictBase | None) -> None:
        """Write `batch` to the buffer (None: the collector wrote it, `trajs_per_write` whole
        episodes at a time)."""
        if batch is None:
            return
        buffer = self.spec.replay_buffer
        extend_as = getattr(buffer, "extend_as", None)  # ours counts each writer's items
        if callable(extend_as):
            extend_as(self.writer, batch)
        else:
            buffer.extend(batch)

    def start(self, frames: int) -> None:
        """Extend the replay buffer batch after batch in the background, `frames` frames in
        all (0: until stopped)."""
        self._check_restored()
        if self.spec.replay_buffer is None:
            raise MisuseError("start() fills a replay buffer; this actor was given none.")
        self.share, self.written = frames, 0
        self.loop.start()

    def _write_batch(self) -> bool:
        batch, frames, _ = self._next_batch()
        self._extend(batch)
        self.written += frames
        return not (self.share and self.written >= self.share)

    def progress(self) -> tuple[int, str | None]:
        """Frames written since `start()`, and the traceback that stopped the background
        collection (None while it is well)."""
        self._check_restored()
        error = self.loop.error
        failure = None if error is None else "".join(traceback.format_exception(error))
        return self.written, failure

    def pause(self) -> None:
        """Hold background collection between two batches until `resume()`."""
        self._check_restored()
        self.paused.enter_context(self.loop.pause())

    def resume(self) -> None:
        self.paused.close()

    def stop(self) -> int:
        """End background collection (the batch in flight is written) and return the frames
        written since `start()`; raises what stopped it, if anything did."""
        self._check_restored()
        try:
            self.loop.shutdown()
        finally:
            self.paused.close()
        return self.written

    @contextlib.contextmanager
    def _between_batches(self) -> Iterator[None]:
        """Hold background collection (if it runs) while the block changes the collector."""
        if self.loop.is_busy:
            with self.loop.pause():
                yield
        else:
            yield

    # --- weights, seeds, state ------------------------------------------------------------------

    def apply_weights(self, weights: Any, version: int, timeout: float | None) -> int:
        """Load the weights Ray resolved from the object store, as `version`, between two
        batches (a multi-process collector forwards them to its workers within `timeout`)."""
        self._check_restored()
        with self._between_batches():
            self.collector.apply_weights(weights, version, timeout)
        return version

    def update_models(self, models: dict[str, Any], timeout: float | None) -> Exception | None:
        """Load the weights of models other than the policy (by attribute path, e.g. a value
        network in an env transform) between two batches; a multi-process collector forwards
        them to its workers within `timeout`. A model id or weights that do not fit come back
        as the error, for the driver to raise: the actor goes on."""
        self._check_restored()
        try:
            with self._between_batches():
                self.collector.update_policy_weights_(weights_dict=models, timeout=timeout)
        except (KeyError, TypeError, ValueError) as error:
            return error
        return None

    def set_seed(self, seed: int) -> int:
        """Seed the env and this process's torch generator; returns the next seed."""
        self._check_restored()
        torch.manual_seed(seed)
        return int(self.collector.set_seed(seed))

    def reset(self) -> None:
        self._check_restored()
        self.collector.reset()

    def getattr_env(self, attr: str) -> EnvAttribute:
        """An attribute of the collector's env, as `env_attribute` answers it."""
        self._check_restored()
        with self._between_batches():
            return env_attribute(self.collector, attr)

    def assign_trajectory_ids(self, offset: int, stride: int) -> None:
        self.collector.assign_trajectory_ids(offset, stride)

    def state_dict(self) -> dict[str, Any]:
        self._check_restored()
        with self._between_batches():
            return dict(self.collector.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check_restored()
        self.collector.load_state_dict(state)

    def stats(self) -> dict[str, Any]:
        """The collector's statistics, with the seconds this actor spent collecting."""
        self._check_restored()
        with self._between_batches():
            stats = dict(self.collector.stats())
        stats["collect_seconds"] = self.collect_seconds
        return stats

    def process_ids(self) -> list[int]:
        """This actor's process and every worker process below it."""
        below = getattr(self.collector, "process_ids", None)
        return [os.getpid(), *(below() if callable(below) else [])]

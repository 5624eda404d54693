"""`MultiCollectorBase`: what the multi-process collectors share (workers, weights, state).

The rollout loop stays the one of `Collector` (or of whatever `collector_class` is): each worker
process runs one, and this room around it decides only where it runs and how its batches come
back. `MultiSyncCollector` and `MultiAsyncCollector` differ only in how they gather batches.
"""

from __future__ import annotations

import math
import pickle
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
from tensordict import TensorDictBase

from rlcollect.collectors.children import check_options, collector_class_of, resolve_children
from rlcollect.collectors.devices import DeviceSplit
from rlcollect.collectors.legacy_updater import check_weight_updater
from rlcollect.collectors.multiprocess.control import MultiCollectorControl
from rlcollect.collectors.multiprocess.ledger import WriteLedger
from rlcollect.collectors.multiprocess.options import (
    WORKER_TIMEOUT,
    SharedInterruptor,
    check_preemptive_threshold,
    check_worker_arguments,
    fault_options_for_children,
    in_worker_process,
    preempts,
    waits_for_workers,
)
from rlcollect.collectors.multiprocess.pool import WorkerPool
from rlcollect.collectors.multiprocess.shared_buffer import prepare_shared_buffer
from rlcollect.collectors.multiprocess.updates import HeldUpdate, WeightDelivery
from rlcollect.collectors.multiprocess.watchdog import Watchdog
from rlcollect.collectors.multiprocess.worker import WorkerCommand, WorkerSpec
from rlcollect.collectors.options import (
    BatchOptions,
    round_to_batches,
    validate_frames,
)
from rlcollect.collectors.policy.acceleration import RequestedAcceleration
from rlcollect.collectors.policy.policy_map import policy_or_map
from rlcollect.collectors.policy.weights import WeightsLayout
from rlcollect.collectors.single.collector import Collector
from rlcollect.collectors.weights.schemes import (
    POLICY_MODEL_ID,
    NoWeightSyncScheme,
    SharedMemWeightSyncScheme,
    Weights,
    WeightSyncScheme,
    check_schemes,
)
from rlcollect.collectors.weights.sender import (
    UPDATE_TIMEOUT,
    SentWeights,
    check_update_timeout,
    select_children,
)
from rlcollect.errors import MisuseError
from rlcollect.runtime.fan_out import per_child
from rlcollect.runtime.fork_server import can_share_parent_fork_server
from rlcollect.runtime.processes import threads_beside, worker_context

# Options that may be given once or as one value per worker.
PER_WORKER_OPTIONS = (
    "device",
    "storing_device",
    "policy_device",
    "env_device",
    "create_env_kwargs",
)


class MultiCollectorBase(MultiCollectorControl):
    """Runs one collector per worker process; subclasses gather their batches.

    See `MultiSyncCollector` for the arguments. Workers are started at construction (in
    parallel, from a preloaded fork server) and stopped by `shutdown()`, by garbage
    collection, or at interpreter exit; a worker also ends on its own when this process dies.
    The constructor returns once they have built their collectors, but in a process of a
    torch.distributed group (see `options.waits_for_workers`).
    """

    # A worker that runs one of these inherits `restart_dead_workers`, `worker_timeout` and
    # `startup_timeout` (see `fault_options_for_children`).
    accepts_fault_options = True
    takes_env_maker_list = True

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        num_workers: int | None = None,
        frames_per_batch: int | Sequence[int],
        total_frames: int = -1,
        collector_class: Callable[..., Any] = Collector,
        update_at_each_batch: bool = False,
        num_threads: int | None = None,
        num_sub_threads: int = 1,
        weight_sync_schemes: Mapping[str, WeightSyncScheme] | None = None,
        weight_recv_schemes: Mapping[str, Any] | None = None,
        policy_factory: Callable[[], Any] | Sequence[Callable[[], Any]] | None = None,
        restart_dead_workers: bool = False,
        worker_timeout: float | None = WORKER_TIMEOUT,
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        split_trajs: bool = False,
        compact_obs: bool = False,
        store_obs_once: bool = False,
        return_same_td: bool = False,
        replay_buffer: Any = None,
        init_random_frames: int | None = None,
        mp_start_method: str | None = None,
        startup_timeout: float = 300.0,
        preemptive_threshold: float | None = None,
        init_fn: Callable[[], None] | None = None,
        worker_idx: int | None = None,
        weight_updater: Any = None,
        **collector_options: Any,
    ) -> None:
        policy = policy_or_map(
            policy,
            collector_options.pop("policies", None),
            collector_options.pop("policy_mapping_fn", None),
        )
        collector_class = collector_class_of(collector_class)
        env_makers, num_workers = resolve_children(
            create_env_fn, num_workers, "num_workers", "worker"
        )
        per_worker_frames = self._split_frames(frames_per_batch, num_workers)
        _, total_frames = validate_frames(1, total_frames)
        factories = check_worker_arguments(
            policy=policy,
            policy_factory=policy_factory,
            num_workers=num_workers,
            worker_timeout=worker_timeout,
            num_sub_threads=num_sub_threads,
            init_fn=init_fn,
        )
        weight_updater = check_weight_updater(weight_updater)
        self.preemptive_threshold = check_preemptive_threshold(preemptive_threshold)
        # Shared with every worker's collector, which polls it after each env step.
        self.interruptor = SharedInterruptor() if preempts(self.preemptive_threshold) else None
        self.worker_idx = worker_idx
        self._init_fn = init_fn
        # Whether batches carry a device: as a worker's `Collector` decides it (TorchRL's rule).
        devices = {
            name: per_child(name, collector_options.get(name), num_workers)
            for name in ("device", "env_device", "policy_device", "storing_device")
        }
        self._device_given = any(
            DeviceSplit.resolve(
                env_own_device=torch.device("cpu"),
                **{name: values[index] for name, values in devices.items()},
            ).storing_is_explicit
            for index in range(num_workers)
        )
        check_options(collector_class, collector_options)
        # TorchRL's attributes; the workers' collectors compile (checked here, before any starts).
        (
            self.compiled_policy,
            self.compiled_policy_kwargs,
            self.cudagraphed_policy,
            self.cudagraphed_policy_kwargs,
        ) = RequestedAcceleration.of(
            collector_options.get("compile_policy"), collector_options.get("cudagraph_policy")
        )
        self._options_given = dict(collector_options)
        self.options = BatchOptions.validate(
            postproc=postproc,
            split_trajs=split_trajs,
            compact_obs=compact_obs,
            # Here, on the gathered batch: a stored-once batch varies in shape, so it cannot go
            # through a worker's shared batch (workers that write a buffer write it whole).
            store_obs_once=store_obs_once,
            return_same_td=return_same_td,
            replay_buffer=replay_buffer,
            # checked here, used by the workers (they write the buffer)
            extend_buffer=collector_options.get("extend_buffer", True),
            weight_sync_schemes=None,
            weight_recv_schemes=weight_recv_schemes,
        )
        self.num_workers = num_workers
        self.update_at_each_batch = bool(update_at_each_batch)
        # With only a factory, the policy is built in the workers alone: its weights' layout
        # comes from worker 0 when an update first needs it, and a scheme that lays out a
        # shared copy is connected at that first update (its channel then sent to the workers).
        self._factory_only = policy is None and factories[0] is not None
        self.weights = SentWeights(
            policy, factories[0], self._policy_layout if self._factory_only else None
        )
        self.scheme = self._choose_scheme(weight_sync_schemes)
        self._connect_late = self._factory_only and self.scheme.needs_layout
        if not self._connect_late:
            self.scheme.connect(self.weights.template, num_workers)
        self.policy_version = 0
        self._frames = 0
        # Frames each worker committed to the replay buffer (counted by the write's commit).
        self.ledger = WriteLedger(replay_buffer, num_workers)
        self.iterations = 0
        self._start_time: float | None = None
        self._final: tuple[dict[str, Any], dict[str, Any]] | None = None
        self._in_background = False
        self._watchdog: Watchdog | None = None
        self._pauses = 0
        # This process's torch threads while the workers run, given back at shutdown.
        self._threads_before: int | None = None
        if num_threads is not None or not in_worker_process():
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(num_threads or threads_beside(num_workers))
        specs = self._worker_specs(
            env_makers,
            policy,
            factories,
            per_worker_frames,
            collector_class,
            {
                **collector_options,
                **fault_options_for_children(
                    collector_class,
                    restart_dead_workers=restart_dead_workers,
                    worker_timeout=worker_timeout,
                    startup_timeout=startup_timeout,
                ),
                "init_random_frames": init_random_frames,
                # Workers that write the buffer themselves process what they write; otherwise
                # the gathered batch is processed here.
                **(
                    {"postproc": postproc, "split_trajs": split_trajs, "compact_obs": compact_obs}
                    if replay_buffer is not None
                    else {}
                ),
            },
            replay_buffer,
        )
        prepare_shared_buffer(replay_buffer, specs[0])
        # In a node of a distributed launcher (see `waits_for_workers`), workers are spawned
        # unless asked otherwise: starting a fork server blocks until it has imported torch.
        # A node that a fork server forked has its workers forked by that server, which runs.
        waits = waits_for_workers()
        spawned = not (waits or can_share_parent_fork_server())
        self.pool = WorkerPool(
            specs,
            worker_context(mp_start_method or ("spawn" if spawned else None)),
            num_sub_threads=num_sub_threads,
            worker_timeout=worker_timeout,
            restart_dead_workers=restart_dead_workers,
            startup_timeout=startup_timeout,
            on_failure=self.shutdown,
            current_weights=lambda: (self.weights.current, self.policy_version),
            ledger=self.ledger,
            await_ready=waits,
        )
        self.frames_per_batch = self._batch_frames()
        self.total_frames = self._round_total(total_frames)
        # TorchRL's meaning (its trainers read it): the random frames asked for, in all; the
        # workers share them out (each takes its share rounded up, `_worker_specs`).
        self.init_random_frames = int(init_random_frames or 0)
        self.delivery = WeightDelivery(self.pool, self.scheme, self._prepare_scheme)
        self._adopt_scheme_receivers()
        self._adopt_weight_updater(weight_updater)

    def _worker_specs(
        self,
        env_makers: Sequence[Any],
        policy: Any,
        factories: Sequence[Callable[[], Any] | None],
        frames: Sequence[int],
        collector_class: Callable[..., Any],
        collector_options: dict[str, Any],
        replay_buffer: Any,
    ) -> list[WorkerSpec]:
        """What each worker builds: its env maker, frames and options (per-worker values
        picked, `init_random_frames` shared out), trajectory ids `i, i + W, ...`, and the
        shared objects (buffer, frame counter, weight channel, interruptor) that travel as
        handles. A worker given a factory gets no copy of the policy, but its weights."""
        options = dict(collector_options)
        options["init_random_frames"] = -(-(options["init_random_frames"] or 0) // len(frames))
        options["init_random_frames"] = options["init_random_frames"] or None
        specs = []
        for index, maker in enumerate(env_makers):
            own = {
                name: per_child(name, options[name], self.num_workers)[index]
                for name in PER_WORKER_OPTIONS
                if name in options
            }
            factory = factories[index]
            specs.append(
                WorkerSpec(
                    collector_class=collector_class,
                    create_env_fn=maker,
                    policy=policy if factory is None else None,
                    policy_factory=factory,
                    frames_per_batch=frames[index],
                    total_frames=-1,  # this collector decides when to stop
                    collector_kwargs={**options, **own},
                    trajectory_ids=(index, self.num_workers),
                    scheme=self.scheme,
                    index=index,
                    weights=self.weights.current if policy is not None and factory else None,
                    init_fn=self._init_fn,
                    shared={
                        "replay_buffer": self.ledger.view(index),
                        "weights": self.scheme.channel(index),
                        "interruptor": self.interruptor,
                    },
                )
            )
        return specs

    @staticmethod
    def _split_frames(frames_per_batch: Any, num_workers: int) -> list[int]:
        if isinstance(frames_per_batch, list | tuple):
            if len(frames_per_batch) != num_workers:
                # TorchRL's wording first: scripts match on it.
                raise ValueError(
                    "If `frames_per_batch` is provided as a sequence, it should contain exactly "
                    f"one value per worker: got {len(frames_per_batch)} values for "
                    f"num_workers={num_workers}; give one entry per worker, or one int for all."
                )
            frames = per_child("frames_per_batch", list(frames_per_batch), num_workers)
            for value in frames:
                validate_frames(value, -1)
            return [int(value) for value in frames]
        frames_per_batch, _ = validate_frames(frames_per_batch, -1)
        each = math.ceil(frames_per_batch / num_workers)
        if each * num_workers != frames_per_batch:
            warnings.warn(
                f"frames_per_batch={frames_per_batch} is not a multiple of num_workers="
                f"{num_workers}; each worker collects {each} frames ({each * num_workers} a "
                "batch).",
                stacklevel=4,
            )
        return [each] * num_workers

    def _choose_scheme(self, schemes: Mapping[str, WeightSyncScheme] | None) -> WeightSyncScheme:
        checked = check_schemes("weight_sync_schemes", schemes, other_models=True)
        chosen = checked.get(POLICY_MODEL_ID)
        if chosen is not None:
            return chosen
        # With only a factory, whether there are weights is worker 0's to say at the first update.
        if self._factory_only or self.weights.template:
            return SharedMemWeightSyncScheme()
        return NoWeightSyncScheme()

    def _connect_scheme(self, weights: Weights, timeout: float) -> None:
        """Lay out the scheme's shared copy from the first update's `weights` (checked against
        worker 0's layout) and hand its channel to every worker, now and at a restart."""
        self.scheme.connect(weights, self.num_workers)
        self._connect_late = False
        for index, spec in enumerate(self.pool.specs):
            spec.shared["weights"] = self.scheme.channel(index)
        for slot in self.pool.slots:
            payload = bytes(ForkingPickler.dumps(self.scheme.channel(slot.index)))
            self.pool.request([slot], WorkerCommand.WEIGHT_CHANNEL, 0, payload, timeout)

    def _policy_layout(self) -> WeightsLayout | None:
        """Worker 0's policy weights layout (None before the workers start)."""
        pool = getattr(self, "pool", None)
        if pool is None:
            return None
        (reply,) = pool.request(pool.slots[:1], WorkerCommand.POLICY_LAYOUT)
        return pickle.loads(reply)  # type: ignore[no-any-return]

    def _batch_frames(self) -> int:
        """Frames the collector hands out per batch (subclasses: per gathered batch)."""
        return sum(slot.frames_per_batch for slot in self.pool.slots)

    def _round_total(self, total_frames: int) -> int:
        """`total_frames` rounded up to whole gathered batches, with a warning, as `Collector`
        rounds it."""
        return round_to_batches("total_frames", total_frames, self.frames_per_batch, 4)

    # --- iteration ------------------------------------------------------------------------------

    @property
    def frames(self) -> int:  # type: ignore[override]  # a count the workers keep too
        """Frames collected: handed out by `next()`, or written to the replay buffer by the
        workers (in the background too). While they write in the background, reading it also
        checks that they live, so a loop waiting on it learns of a dead worker (or has it
        restarted) instead of waiting forever."""
        if not self._in_background:
            return self._frames + self.pool.counted()
        if self.pool.is_open or self.pool.failure is not None:
            self.pool.check_alive()
        return self._frames + self.ledger.total()

    def next(self) -> TensorDictBase | None:
        """Collect and return one batch (None when the workers fill a replay buffer).

        Raises:
            StopIteration: when `total_frames` have been collected.
        """
        raise NotImplementedError

    def _check_open(self) -> None:
        self.pool.check_open()

    def _finish(self, batch: TensorDictBase) -> TensorDictBase:
        if not self._device_given and batch.device is not None:
            # No `device` / `storing_device`: no device on the batch, as TorchRL's.
            batch = batch.clone(recurse=False).clear_device_()
        for process in self.options.pipeline:
            batch = process(batch)
        return batch

    # --- weights --------------------------------------------------------------------------------

    def apply_weights(
        self,
        weights: Weights,
        version: int,
        timeout: float | None = UPDATE_TIMEOUT,
        worker_ids: int | Sequence[int] | None = None,
    ) -> None:
        """Send validated weights as `version` to the workers and wait for the
        acknowledgements of those idle (what a parent collector's update calls in a worker).
        A worker collecting a batch gets them before its next command instead, so that no
        update waits behind a batch: none it starts afterwards runs older weights (see
        `updates.WeightDelivery`). With a scheme whose `sync` is False, return once they are
        sent: the acknowledgements of an update are awaited before the next one is packed, so
        no worker reads weights being rewritten."""
        self.pool.check_open()
        timeout = check_update_timeout(timeout)
        slots = select_children(self.pool.slots, worker_ids, "worker")
        with self.pool.lock:
            self.weights.record(weights)
            self.policy_version = version
            if self.scheme.sends_weights:
                update = HeldUpdate(self.weights.current, version, timeout)  # type: ignore[arg-type]
                self.delivery.deliver(slots, update)

    def _prepare_scheme(self, weights: Weights, timeout: float) -> None:
        """Before a pack: lay out the scheme at the first update, when only a factory was
        given."""
        if self._connect_late:
            self._connect_scheme(weights, timeout)

    # --- background collection into a shared replay buffer -------------------------------------

    def start(self) -> None:
        """Every worker extends the shared replay buffer in the background until shut down,
        each with its share of the frames left of `total_frames` (whole batches)."""
        if self.options.replay_buffer is None:
            raise RuntimeError(
                "start() fills a replay buffer; pass replay_buffer=ReplayBuffer(..., "
                "shared=True) to the collector."
            )
        if self._in_background:
            raise MisuseError("start() was already called; the workers are filling the buffer.")
        if self.is_done:
            return  # total_frames already collected: nothing is left to write
        self.pool.check_open()
        if self._start_time is None:
            self._start_time = time.perf_counter()
        left = self.total_frames - self.frames if self.total_frames > 0 else 0
        every_batch = sum(slot.frames_per_batch for slot in self.pool.slots)
        written = self.ledger.written()
        for slot in self.pool.slots:
            # In proportion to the worker's batch, in whole batches (0: no limit).
            share = -(-left * slot.frames_per_batch // every_batch)
            share = -(-share // slot.frames_per_batch) * slot.frames_per_batch
            self.pool.start_background(slot, share, written[slot.index])
        self._in_background = True
        self._watchdog = Watchdog(self.pool, lambda: self._pauses > 0)

    @contextmanager
    def pause(self) -> Iterator[None]:
        """Context manager: no worker collects or writes while it is active (pauses nest:
        the workers go on when the outermost one ends)."""
        if not self._pauses:
            self.pool.request(self.pool.slots, WorkerCommand.PAUSE)
        self._pauses += 1
        try:
            yield
        finally:
            self._pauses -= 1
            if not self._pauses and self.pool.is_open:
                self.pool.request(self.pool.slots, WorkerCommand.RESUME)

    def async_shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop background collection in every worker, and with `close_env` the workers too.

        A batch being collected is abandoned, as `Collector.async_shutdown` does. With
        `close_env`, the final `state_dict()` and `stats()` are kept: both still answer
        afterwards (e.g. for a last checkpoint), as they do for a single collector.
        """
        self._stop_watchdog()
        if self.pool.is_open:
            self.pool.request(self.pool.slots, WorkerCommand.STOP, timeout=timeout)
            self._in_background = False
            self.pool.count_written()
            for slot in self.pool.slots:
                slot.background = None
            if close_env:
                self._final = (self.state_dict(), self.stats())
        if close_env:
            self.shutdown()

    @property
    def yields_whole_episodes(self) -> bool:
        options = self._options_given
        return options.get("trajs_per_batch") is not None or (
            options.get("batch_mode") == "complete_episodes"
        )

    def _shut_down(self, timeout: float | None, close_env: bool) -> None:
        """Stop every worker, abandoning the batches in flight, and release the shared
        memory; bounded in time (the pool's own bound), idempotent."""
        self._stop_watchdog()
        self.pool.close()
        self.ledger.release()
        self.scheme.close()
        threads, self._threads_before = self._threads_before, None
        if threads is not None:
            torch.set_num_threads(threads)  # as before this collector (TorchRL's)

    def _stop_watchdog(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.stop()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_workers={self.num_workers}, "
            f"frames_per_batch={self.frames_per_batch}, total_frames={self.total_frames}, "
            f"frames={self.frames})"
        )

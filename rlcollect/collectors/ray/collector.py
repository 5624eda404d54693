"""`RayCollector`: collectors run as Ray actors, on one machine or a cluster.

The rollout loop stays `Collector`'s (or that of `collector_class`): each actor runs one, and this
room around it decides only where it runs and how batches come back (through Ray's object store,
or straight into a Ray-served replay buffer).
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.collectors.children import (
    RESTART_ID_GAP,
    collector_class_of,
    gather_batches,
    gather_episodes,
)
from rlcollect.collectors.options import BatchOptions, round_to_batches, validate_frames
from rlcollect.collectors.policy.policy_map import policy_or_map
from rlcollect.collectors.policy.weights import Weights
from rlcollect.collectors.ray.actor import writer_name
from rlcollect.collectors.ray.background import BackgroundWriting
from rlcollect.collectors.ray.control import RayCollectorControl
from rlcollect.collectors.ray.fleet import CLOSE_TIMEOUT, ActorFleet, ActorSlot, Call
from rlcollect.collectors.ray.options import (
    actor_episode_layout,
    check_flag,
    check_interval,
    check_timeout,
    plan_actors,
)
from rlcollect.collectors.ray.weights import ActorWeights
from rlcollect.collectors.single.collector import Collector
from rlcollect.collectors.single.front_door import register_backend
from rlcollect.collectors.weights.sender import (
    CHILD_TIMEOUT_SHARE,
    UPDATE_TIMEOUT,
    check_update_timeout,
    select_children,
)
from rlcollect.errors import MisuseError
from rlcollect.runtime.ray_lease import RayLease, check_init_config, require_ray

# A restarted actor's seed moves on by this much per restart, so it does not replay its past.
RESTART_SEED_STRIDE = 7919


class RayCollector(RayCollectorControl):
    """Runs one collector per Ray actor and yields their batches, as TorchRL's `RayCollector`.

    Every actor runs `collector_class` (a `Collector`, or a `MultiSyncCollector` so that one actor
    drives several worker processes on its node) and its batches travel through Ray's object
    store. Trajectory ids stay unique across actors (actor i of N draws `i + k N`, split further
    among its own workers). Ray is started with `ray.init(**ray_init_config)` when this process
    has not initialised it, and then shut down with the last rlcollect object that uses it.

    Args:
        create_env_fn: one env maker per actor (a list), or one for all with `num_collectors`.
            Makers and policies travel to the actors pickled: give importable functions or
            `functools.partial`s, build the envs there.
        policy: None (random actions), a TensorDict module or an `nn.Module`; every actor
            gets its own copy; training this one reaches them only through updates.

    Keyword Args:
        num_collectors: actors, when `create_env_fn` is a single maker.
        frames_per_batch: `sync=True`: frames per gathered batch (each actor collects
            `ceil(fpb / N)`); `sync=False`: frames of every actor's batch.
        total_frames: frames over the collector's life; -1 collects forever.
        collector_class: what each actor runs: `Collector`, or a multi-process collector class
            (or `functools.partial(MultiSyncCollector, num_workers=2)`); TorchRL's "single",
            "sync" and "async" name ours.
        num_workers_per_collector: TorchRL's: the workers of each actor's multi-process
            collector, each with a copy of the actor's env maker (default 1: a list of one
            maker, as TorchRL hands any class but `Collector`); `num_workers` given to
            `collector_class` (a `functools.partial`, `collector_kwargs`) does the same.
            A `Collector` runs one env: more than 1 is refused.
        collector_kwargs: options of every actor's collector (a dict), or one dict per actor.
        remote_configs: `ray.remote` options of every actor (`num_cpus`, `num_gpus`, `memory`,
            `object_store_memory`, `resources`, ...: whatever Ray takes, checked by Ray here),
            or one dict per actor; default `{"num_cpus": 1}`. Restarts and concurrency are
            RayCollector's (`restart_dead_collectors`).
        sync: True yields `[num_collectors, *env_batch, T]` (row i from actor i); False yields
            each actor's batch as it is ready (with `track_worker_id=True`, carrying
            `("collector", "worker_id")`: off by default, as TorchRL's). Batches of
            whole episodes (`batch_mode="complete_episodes"`, `trajs_per_batch`) vary in
            length, so `sync=True` gathers them as `MultiSyncCollector` does: flat ones
            concatenated along time (`[frames]`, actor after actor), padded ones padded to
            the longest episode and concatenated along trajectories (`[N * actors, max_len]`).
        ray_init_config: `ray.init` arguments, used only when Ray is not initialised here:
            `{"address": "auto"}` joins the cluster `ray start --head` started.
        update_after_each_batch: send the policy's weights before every batch (the actor that
            delivered, for `sync=False`); the same as `max_weight_update_interval=0`.
        max_weight_update_interval: an actor that collected more batches than this since its
            weights were last sent gets the policy's weights before its next one (-1: never).
        replay_buffer: a `RayReplayBuffer` (any Ray-served buffer): the actors extend it
            themselves, iteration yields None, and `start()` runs them in the background.
            A `RayReplayBuffer` counts each actor process's writes, so an actor lost with
            its node after writing and before reporting it is still counted in `frames`.
        weight_sync_schemes: `{"policy": RayWeightSyncScheme()}` (the default) or
            `NoWeightSyncScheme()`.
        weight_recv_schemes: `{"policy": receiver}` polled before every batch; what it
            returns is sent to the actors.
        policy_factory: builds the policy inside each actor instead of copying `policy` (or a
            list, one per actor).
        restart_dead_collectors: an actor that dies is restarted (Ray's actor restarts; one
            that Ray gave up on is created again) with the current weights, fresh trajectory
            ids and its seed moved on, while the others keep collecting.
        worker_timeout: seconds an actor may take to answer (a batch included); None waits.
        startup_timeout: seconds the actors may take to be scheduled and build collectors.
        postproc, split_trajs: run here on every yielded batch (in the actors, before they
            write, with a replay buffer).
        compact_obs: TorchRL's (see `Collector`): the `("next", <observation>)` entries left
            out; here, on the gathered batch (in the actors, before they write, with a buffer).
        store_obs_once: ours: observations stored once (see `Collector`); here, on the
            gathered batch.
        track_worker_id: with `sync=False`, every batch carries `("collector", "worker_id")`,
            its actor's index (ours; TorchRL's batches have no such key).
        init_random_frames: random frames before the policy is used, shared out among actors.
        **collector_options: any other option of `collector_class` (device split,
            `max_frames_per_traj`, `track_policy_version`, RLlib's `batch_mode`,
            `soft_horizon`, `no_done_at_end`, `view_requirements`, ...), for every actor:
            each actor applies them, this process gathers.

    Raises:
        ActorError: an actor raised (with its traceback), died, or did not answer in time;
            the collector shuts down first (unless a dead actor may be restarted).

    Examples:
        >>> from rlcollect.collectors import RayCollector
        >>> with RayCollector(
        ...     "CartPole-v1",
        ...     num_collectors=2,
        ...     frames_per_batch=100,
        ...     total_frames=200,
        ...     ray_init_config={"num_cpus": 2, "include_dashboard": False},
        ... ) as collector:
        ...     for data in collector:
        ...         print(data.batch_size, data.names)
        torch.Size([2, 50]) [None, 'time']
        torch.Size([2, 50]) [None, 'time']
    """

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        num_collectors: int | None = None,
        frames_per_batch: int,
        total_frames: int = -1,
        collector_class: Callable[..., Any] = Collector,
        num_workers_per_collector: int = 1,
        collector_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        remote_configs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        sync: bool = True,
        ray_init_config: Mapping[str, Any] | None = None,
        update_after_each_batch: bool = False,
        max_weight_update_interval: int = -1,
        replay_buffer: Any = None,
        weight_sync_schemes: Mapping[str, Any] | None = None,
        weight_recv_schemes: Mapping[str, Any] | None = None,
        policy_factory: Callable[[], Any] | Sequence[Callable[[], Any]] | None = None,
        restart_dead_collectors: bool = False,
        worker_timeout: float | None = 300.0,
        startup_timeout: float = 300.0,
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        split_trajs: bool = False,
        compact_obs: bool = False,
        store_obs_once: bool = False,
        init_random_frames: int | None = None,
        track_worker_id: bool = False,
        **collector_options: Any,
    ) -> None:
        require_ray("RayCollector")
        if not isinstance(track_worker_id, bool):
            raise TypeError(f"track_worker_id must be True or False; got {track_worker_id!r}.")
        self.track_worker_id = track_worker_id
        # --- every argument checked before Ray starts ---
        policy = policy_or_map(
            policy,
            collector_options.pop("policies", None),
            collector_options.pop("policy_mapping_fn", None),
        )
        self.sync = check_flag("sync", sync)
        collector_class = collector_class_of(collector_class)
        specs, configs = plan_actors(
            create_env_fn,
            num_collectors=num_collectors,
            frames_per_batch=frames_per_batch,
            sync=self.sync,
            collector_class=collector_class,
            collector_kwargs=collector_kwargs,
            remote_configs=remote_configs,
            policy=policy,
            policy_factory=policy_factory,
            replay_buffer=replay_buffer,
            init_random_frames=init_random_frames,
            num_workers_per_collector=num_workers_per_collector,
            # Actors that write the buffer themselves process what they write.
            options={
                **collector_options,
                "postproc": postproc,
                "split_trajs": split_trajs,
                "compact_obs": compact_obs,
            }
            if replay_buffer is not None
            else collector_options,
        )
        _, total_frames = validate_frames(1, total_frames)
        # in all, as TorchRL's trainers read it
        self.init_random_frames = int(init_random_frames or 0)
        self._episode_layout = actor_episode_layout(specs, self.sync)
        self.options = BatchOptions.validate(
            postproc=postproc,
            split_trajs=split_trajs,
            compact_obs=compact_obs,
            # here, on the gathered batch (as multi-process ones do)
            store_obs_once=store_obs_once,
            return_same_td=False,
            replay_buffer=replay_buffer,
            extend_buffer=True,
            weight_sync_schemes=None,
            weight_recv_schemes=weight_recv_schemes,
        )
        init_config = check_init_config(ray_init_config)
        self.weights = ActorWeights(
            policy, specs[0].policy_factory, weight_sync_schemes, len(specs)
        )
        every_batch = check_flag("update_after_each_batch", update_after_each_batch)
        interval = check_interval(max_weight_update_interval)
        self.update_after_each_batch = every_batch
        self.max_weight_update_interval = 0 if every_batch else interval
        restart = check_flag("restart_dead_collectors", restart_dead_collectors)
        call_timeout = check_timeout("worker_timeout", worker_timeout, allow_none=True)
        start_timeout = check_timeout("startup_timeout", startup_timeout, allow_none=False)
        self._count(len(specs))
        # --- Ray, and the actors ---
        self._lease = RayLease.acquire(init_config)
        self._release = weakref.finalize(self, self._lease.release)
        self.fleet = ActorFleet(
            restart_dead=restart,
            call_timeout=call_timeout,
            on_restart=self._restore,
            on_failure=self.shutdown,
        )
        self.background = BackgroundWriting(self.fleet, len(specs))
        try:
            self.fleet.launch(specs, configs, policy, start_timeout)  # type: ignore[arg-type]
        except BaseException:
            self._release()
            raise
        every = [slot.frames_per_batch for slot in self.fleet.slots]
        self.frames_per_batch = sum(every) if self.sync else max(every)
        if self.sync:
            total_frames = round_to_batches("total_frames", total_frames, self.frames_per_batch, 2)
        self.total_frames = total_frames

    def _count(self, num: int) -> None:
        """Counters of a fresh collector of `num` actors."""
        self.num_collectors = num
        self.policy_version = 0
        self._frames = 0
        self.iterations = 0
        self._start_time: float | None = None
        self._final: tuple[dict[str, Any], dict[str, Any]] | None = None
        self._seeds: list[int | None] = [None] * num
        # The latest weights of each model other than the policy, for restarted actors.
        self._models: dict[str, Any] = {}
        self._pending: dict[int, Call] = {}  # sync=False: the collect in flight per actor
        self._writes_counted = False  # what the ended actors wrote is counted
        self._turn = 0

    # --- iteration ------------------------------------------------------------------------------

    @property
    def frames(self) -> int:  # type: ignore[override]  # the actors count in the background
        """Frames collected: handed out by `next()`, or written to the replay buffer by the
        actors (while they write in the background, reading it asks them, which also reports a
        failed actor or has a dead one restarted)."""
        if self.background.active and self.fleet.is_open:
            return self._frames + self.background.frames_written()
        return self._frames

    def next(self) -> TensorDictBase | None:
        """Collect and return one batch (None when the actors fill a replay buffer).

        Raises:
            StopIteration: when `total_frames` have been collected.
        """
        if self.is_done:
            raise StopIteration
        self._before_batch()
        batch = self._next_sync() if self.sync else self._next_async()
        if batch is None:
            return None
        for process in self.options.pipeline:
            batch = process(batch)
        return batch

    def _next_sync(self) -> TensorDictBase | None:
        slots = self.fleet.slots
        self._refresh_weights(slots)
        results = self.fleet.call(slots, "collect")
        self.iterations += 1
        for slot, (_, info) in zip(slots, results, strict=True):
            self._account(slot, info)
        if self.options.replay_buffer is not None:
            return None  # the actors wrote the batch
        batches = [batch for batch, _ in results]
        if self._episode_layout is None:
            return gather_batches(batches, "stack")
        return gather_episodes(batches, self._episode_layout)

    def _next_async(self) -> TensorDictBase | None:
        for slot in self.fleet.slots:
            if slot.index not in self._pending:
                self._launch(slot)
        if not self._pending:
            raise StopIteration
        # Ray reports the first ready call of the list: start after the actor served last.
        order = sorted(self._pending, key=lambda index: (index - self._turn) % self.num_collectors)
        call, (batch, info) = self.fleet.first([self._pending[index] for index in order])
        slot = call.slot
        del self._pending[slot.index]
        self._turn = (slot.index + 1) % self.num_collectors
        self.iterations += 1
        self._account(slot, info)
        if not self.is_done:
            self._launch(slot)
        if batch is None:
            return None
        if self.track_worker_id:
            ids = torch.full(batch.batch_size, slot.index, dtype=torch.int64, device=batch.device)
            batch.set(keys.WORKER_ID, ids)
        return batch  # type: ignore[no-any-return]

    @property
    def yields_whole_episodes(self) -> bool:
        return self._episode_layout is not None

    def _launch(self, slot: ActorSlot) -> None:
        """Ask `slot` for a batch unless the batches on their way reach `total_frames`."""
        if self.total_frames > 0:
            on_the_way = sum(self.fleet.slots[index].frames_per_batch for index in self._pending)
            if self._frames + on_the_way >= self.total_frames:
                return
        self._refresh_weights([slot])
        self._pending[slot.index] = self.fleet.submit(slot, "collect")

    def _account(self, slot: ActorSlot, info: Mapping[str, Any]) -> None:
        self._frames += int(info["frames"])
        slot.counted += int(info["frames"])
        slot.policy_version = int(info["version"])
        self.weights.stale[slot.index] += 1

    # --- weights --------------------------------------------------------------------------------

    def apply_weights(
        self,
        weights: Weights,
        version: int,
        timeout: float | None = UPDATE_TIMEOUT,
        worker_ids: int | Sequence[int] | None = None,
    ) -> None:
        """Send validated weights as `version` to the actors and wait for every
        acknowledgement."""
        self._check_open()
        timeout = check_update_timeout(timeout)
        slots = select_children(self.fleet.slots, worker_ids, "actor")
        self.policy_version = version
        self.weights.send(self.fleet, slots, weights, version, timeout)

    def _update_models(
        self, models: dict[str, Any], worker_ids: Any, timeout: float | None
    ) -> None:
        """Have every actor of `worker_ids` (None: all) load the weights of models other than
        the policy, each checked there against its own model, and wait for every
        acknowledgement. The weights are kept: an actor that Ray restarts loads them too."""
        self._check_open()
        timeout = check_update_timeout(timeout)
        slots = select_children(self.fleet.slots, worker_ids, "actor")
        self._send_models(slots, models, timeout)
        self._models.update(models)

    def _send_models(
        self, slots: Sequence[ActorSlot], models: dict[str, Any], timeout: float
    ) -> None:
        """Have the actors of `slots` load `models`; raise the first error one answers."""
        child_timeout = timeout * CHILD_TIMEOUT_SHARE
        answers = self.fleet.call(
            slots, "update_models", models, child_timeout, timeout=timeout, fatal=False
        )
        for answer in answers:
            if isinstance(answer, Exception):
                raise answer

    def _refresh_weights(self, slots: Sequence[ActorSlot]) -> None:
        """Send the policy's weights to the actors of `slots` whose weights are overdue."""
        due = self.weights.overdue(slots, self.max_weight_update_interval)
        if due:
            self.update_policy_weights_(worker_ids=due)

    def _restore(self, slot: ActorSlot) -> None:
        """Give a restarted actor the current weights (its other models' too), trajectory ids
        of its own and its seed moved on; in the background, it goes on with what is left of
        its share. What its dead process wrote to the buffer after it last reported is counted
        (the buffer saw it)."""
        unreported = self._unreported(slot, slot.restarts - 1)
        offset, stride = slot.spec.trajectory_ids
        ids = (offset + stride * RESTART_ID_GAP * slot.restarts, stride)
        reference = self.weights.current
        seed = self._seeds[slot.index]
        seed = None if seed is None else seed + RESTART_SEED_STRIDE * slot.restarts
        self.fleet.call([slot], "restore", reference, self.policy_version, ids, seed, slot.restarts)
        if reference is not None:
            slot.policy_version = self.policy_version
        if self._models:
            self._send_models([slot], self._models, check_update_timeout(None))
        if self.background.active:
            self.background.resume(slot, unreported)
        else:
            self._frames += unreported
        slot.counted = 0

    def _unreported(self, slot: ActorSlot, incarnation: int) -> int:
        """Frames that process `incarnation` of the actor (0: its first) wrote to the replay
        buffer and the collector never counted (the process died or was ended in between), as
        the buffer counted them; 0 with a buffer that does not count its writers. The process
        is gone, so its count is sealed: a write of its still on its way is refused."""
        written_by = getattr(slot.spec.replay_buffer, "written_by", None)
        if not callable(written_by):
            return 0
        (written,) = written_by([writer_name(slot.spec, incarnation)], seal=True)
        return max(0, int(written) - slot.counted - self.background.reported(slot))

    def _count_last_writes(self) -> None:
        """Once the actors are ended (after a failure too): count what they wrote in the
        background, and what they wrote without reporting it, so that `frames` stays what
        the buffer received from them."""
        if self._writes_counted or self.options.replay_buffer is None:
            return
        self._writes_counted = True
        unreported = 0
        if self.fleet.ray.is_initialized():
            self.fleet.wait_ended(CLOSE_TIMEOUT)  # nothing of theirs still on its way
            with contextlib.suppress(MisuseError):  # the buffer was closed before
                unreported = sum(self._unreported(s, s.restarts) for s in self.fleet.slots)
        self._frames += self.background.abandon() + unreported

    # --- background collection into a Ray-served replay buffer ----------------------------------

    def start(self) -> None:
        """Every actor extends the replay buffer in the background until shut down, each with
        its share of the frames left of `total_frames` (whole batches)."""
        if self.options.replay_buffer is None:
            raise RuntimeError(
                "start() fills a replay buffer; pass replay_buffer=RayReplayBuffer(...) to the "
                "collector."
            )
        if self.is_done:
            return
        self._check_open()
        if self._start_time is None:
            self._start_time = time.perf_counter()
        self.background.start(self.total_frames - self._frames if self.total_frames > 0 else 0)

    def pause(self) -> AbstractContextManager[None]:
        """Context manager: no actor collects or writes while it is active (pauses nest)."""
        return self.background.pause()

    def async_shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop background collection in every actor (each writes the batch it is on), and
        with `close_env` the actors too; `state_dict()` and `stats()` still answer afterwards
        with what the collector ended with."""
        if self.fleet.is_open and self.background.active:
            self._frames += self.background.stop(timeout)
        if close_env and self.fleet.is_open:
            self._final = (self.state_dict(), self.stats())
        if close_env:
            self.shutdown()

    def _shut_down(self, timeout: float | None, close_env: bool) -> None:
        """End every actor (its collector first, bounded in time) and, when this collector
        started Ray and nothing else of rlcollect uses it, Ray too; idempotent."""
        fleet = getattr(self, "fleet", None)
        if fleet is not None:
            fleet.close()
            self._count_last_writes()
        self._pending.clear()
        self.weights.close()
        self._release()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_collectors={self.num_collectors}, sync={self.sync}, "
            f"frames_per_batch={self.frames_per_batch}, total_frames={self.total_frames}, "
            f"frames={self._frames})"
        )


def _ray_backend(
    args: tuple[Any, ...], kwargs: dict[str, Any], num_collectors: int, sync: bool
) -> RayCollector:
    """`Collector(..., backend="ray")`: one actor per env maker, as TorchRL's front door."""
    return RayCollector(*args, num_collectors=num_collectors, sync=sync, **kwargs)


register_backend("ray", _ray_backend)

"""`MultiSyncCollector`: one batch from every worker process, gathered into one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.collectors.children import (
    CAT_RESULTS,
    CatResults,
    episode_layout,
    gather_batches,
    gather_episodes,
    resolve_children,
)
from rlcollect.collectors.devices import finish_cuda_copies
from rlcollect.collectors.multiprocess.base import MultiCollectorBase
from rlcollect.collectors.multiprocess.pool import WorkerSlot
from rlcollect.collectors.sampling.whole_episodes import EpisodeQueue


def mark_valid_frames(batch: TensorDictBase) -> TensorDictBase:
    """A stacked batch cut short by preemption gets TorchRL's `("collector", "mask")`: the
    frames collected (trajectory id not -1)."""
    batch.set(keys.MASK, batch.get(keys.TRAJ_IDS) != -1)
    return batch


def drop_invalid_steps(batch: TensorDictBase) -> TensorDictBase:
    """A worker's batch cut short by preemption, without the time steps no sub-env collected
    (TorchRL drops them when `cat_results` concatenates)."""
    valid = batch.get(keys.TRAJ_IDS) != -1
    valid = valid.reshape(-1, valid.shape[-1]).any(0)
    return batch if bool(valid.all()) else batch[..., valid]


class MultiSyncCollector(MultiCollectorBase, torchrl_shorthand="sync"):
    """Runs one collector per worker process and yields one batch gathered from all of them.

    Every batch holds one batch of every worker, all collected with the same policy version;
    workers collect in parallel and write into shared memory that this process reads.

    Args:
        create_env_fn: one env maker per worker (a list), or one for all with `num_workers`.
        policy: None (random actions), a TensorDict module or an `nn.Module`, as for
            `Collector`. Each worker gets its own copy: training this one in place reaches
            the workers only through `update_policy_weights_()`.

    Keyword Args:
        num_workers: worker processes, when `create_env_fn` is a single maker.
        frames_per_batch: frames per gathered batch (each worker collects `ceil(fpb / W)`),
            or a list with each worker's frames.
        total_frames: frames over the collector's life; -1 collects forever.
        collector_class: what each worker runs: `Collector`, or a multi-process collector (a
            class or `functools.partial`) so that workers run workers of their own; TorchRL's
            "single", "sync" and "async" name ours, and None (TorchRL's Hydra configs pass it)
            is `Collector`.
        cat_results: "stack" (or None, TorchRL's default) yields `[W, *env_batch, T]` (row i
            from worker i); 0 or -1 concatenate the workers' batches along that dim.
        update_at_each_batch: send the policy's weights to the workers before every batch.
        preemptive_threshold: TorchRL's, a share of workers in [0, 1] (None, the default, or
            1.0: never preempt): once `int(W * threshold)` workers have finished their batch,
            the others end theirs at their next step. Their uncollected frames have
            `("collector", "traj_ids")` -1; with "stack" a `("collector", "mask")` entry marks
            the collected frames, with 0 or -1 the time steps no sub-env collected are left
            out. `frames` counts the collected frames. Not with batches of whole episodes.
        init_fn: called with no argument first thing in every worker process (TorchRL's,
            e.g. to start a simulator app), before the env and the policy are built.
        worker_idx: this collector's own index, when it runs inside another collector.
        weight_updater: TorchRL's legacy `WeightUpdaterBase`, honoured as by `Collector`:
            it is handed every update; inside it, `update_policy_weights_(weights,
            worker_ids=i)` reaches worker i through the scheme.
        num_threads: torch threads of this process while the workers run (default
            `max(1, cores - workers)`); shutdown gives back the number it had before.
        num_sub_threads: torch threads of each worker (default 1).
        weight_sync_schemes: `{"policy": scheme}`; `SharedMemWeightSyncScheme` by default.
        weight_recv_schemes: `{"policy": receiver}` polled before every batch; what it
            returns is forwarded to the workers (a collector that is itself a worker).
        policy_factory: builds the policy inside each worker instead of copying `policy` (or a
            list, one factory per worker, as TorchRL takes). Given with `policy`, as TorchRL
            allows it, the workers build theirs with the factory and start from `policy`'s
            weights, which `update_policy_weights_()` reads.
        restart_dead_workers: replace a worker that dies, with the current weights.
        worker_timeout: seconds a worker may take to answer (a batch included); None waits.
            300 by default, or the `MAX_IDLE_COUNT` environment variable as in TorchRL.
        postproc, split_trajs, compact_obs: run here, on the gathered batch (in the workers,
            before they write, with a replay buffer).
        store_obs_once: ours (see `Collector`); here, on the gathered batch.
        mp_start_method: "forkserver" (default where available) or "spawn".
        **collector_options: any other option of `collector_class` (devices also as one
            value per worker). `compile_policy` / `cudagraph_policy` compile the policy in
            each worker; `compiled_policy` and `compiled_policy_kwargs` (TorchRL's) say
            what was asked.

    In a script, build it under `if __name__ == "__main__":`: worker processes import the
    main script again, and must not build collectors of their own when they do.

    Examples:
        >>> from rlcollect.collectors import MultiSyncCollector
        >>> with MultiSyncCollector(
        ...     "CartPole-v1", num_workers=2, frames_per_batch=100, total_frames=200
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
        cat_results: CatResults | None = "stack",
        **options: Any,
    ) -> None:
        if cat_results is None:
            cat_results = "stack"  # TorchRL's default
        if cat_results not in CAT_RESULTS or isinstance(cat_results, bool):
            raise ValueError(
                f"cat_results={cat_results!r} is not supported; use 'stack' (or None), 0 or -1."
            )
        frames = options.get("frames_per_batch")
        if cat_results == "stack" and isinstance(frames, list | tuple) and len(set(frames)) > 1:
            raise ValueError(
                f"cat_results='stack' needs the same frames_per_batch for every worker; got "
                f"{list(frames)}. Use cat_results=-1 to concatenate along time."
            )
        self.cat_results = cat_results
        self._episode_layout = episode_layout(options)
        self._episode_queue, options = self._queue_whole_episodes(create_env_fn, options)
        if options.get("preemptive_threshold") is not None and self._episode_layout:
            raise ValueError(
                f"preemptive_threshold={options['preemptive_threshold']!r} cannot be used with "
                "batches of whole episodes (trajs_per_batch, batch_mode='complete_episodes'): "
                "they have no fixed length to cut short. Drop one of the two."
            )
        super().__init__(create_env_fn, policy, **options)
        if self.interruptor is not None:
            self._preempted = mark_valid_frames if cat_results == "stack" else drop_invalid_steps

    def _queue_whole_episodes(
        self, create_env_fn: Any, options: dict[str, Any]
    ) -> tuple[EpisodeQueue | None, dict[str, Any]]:
        """TorchRL's `trajs_per_batch=N` counts the episodes of a gathered batch: each worker
        then batches `ceil(N / W)` of its own, flat, and this collector hands them out N at a
        time (workers that write a replay buffer write their own N, as TorchRL's do)."""
        count = options.get("trajs_per_batch")
        if count is None or options.get("replay_buffer") is not None:
            return None, options
        _, workers = resolve_children(
            create_env_fn, options.get("num_workers"), "num_workers", "worker"
        )
        each = -(-count // workers) if isinstance(count, int) and count > 0 else count
        queue = EpisodeQueue(count, self._episode_layout or "padded")
        return queue, {**options, "trajs_per_batch": each, "traj_format": "cat"}

    @property
    def is_done(self) -> bool:
        """Whether `total_frames` have been collected and, with `trajs_per_batch`, no whole
        batch of the episodes already collected is left to yield."""
        queue = self._episode_queue
        return super().is_done and (queue is None or not queue.has_batch())

    def next(self) -> TensorDictBase | None:
        """Collect one batch from every worker and return them gathered (None when the
        workers fill a replay buffer).

        Raises:
            StopIteration: when `total_frames` have been collected.
        """
        if self.is_done:
            raise StopIteration
        if self._episode_queue is not None:
            return self._next_episodes(self._episode_queue)
        slots = self._round()
        self.iterations += 1
        if self.options.replay_buffer is not None:
            return None  # the workers wrote the batch, and the pool counted it
        batches = [slot.batch_with_extras() for slot in slots]
        if self.interruptor is None:
            self._frames += sum(slot.last_frames for slot in slots)
        else:
            batches = [self._preempted(batch.copy()) for batch in batches]
            self._frames += sum(_collected_frames(batch) for batch in batches)
        if self._episode_layout is None:
            batch = gather_batches(batches, self.cat_results)
        else:
            batch = gather_episodes(batches, self._episode_layout)
        finish_cuda_copies(batch)  # copied out of the workers' batches before they write again
        return self._finish(batch)

    def _round(self) -> Sequence[WorkerSlot]:
        """A batch from every worker (the policy's weights sent first, where asked)."""
        self._before_batch()
        if self.update_at_each_batch and self.weights.readable:
            self.update_policy_weights_()
        slots = self.pool.slots
        self._collect_round(slots)
        for slot in slots:
            slot.has_batch = False
        return slots

    def _next_episodes(self, queue: EpisodeQueue) -> TensorDictBase:
        """`trajs_per_batch` episodes, from the queue, after as many rounds of the workers
        as it takes to fill it."""
        while not queue.has_batch():
            if super().is_done:
                raise StopIteration  # what is still queued or running is not a whole batch
            slots = self._round()
            self._frames += sum(slot.last_frames for slot in slots)
            episodes = gather_episodes([slot.batch_with_extras() for slot in slots], "cat")
            finish_cuda_copies(episodes)
            queue.add(episodes)
        self.iterations += 1
        return self._finish(queue.take_batch())

    def _collect_round(self, slots: Sequence[WorkerSlot]) -> None:
        """One batch from every worker. With `preemptive_threshold`, once that share of them
        has answered, the others are told to end their batch at their next step.

        The batches are awaited without the pool's lock (as `MultiAsyncCollector` awaits
        them), so that an update from another thread (a TorchRL node's weight receiver)
        returns without waiting for the round: the workers take it before their next one."""
        interruptor = self.interruptor
        self.pool.check_open()
        if interruptor is not None:
            interruptor.start_collection()  # before any worker starts: none is cut at once
        deadline = self.pool.deadline()
        with self.pool.lock:
            for slot in slots:
                self.pool.launch(slot, deadline)
        threshold = 1.0 if self.preemptive_threshold is None else self.preemptive_threshold
        finish_first = int(len(slots) * threshold)  # 0.0: every worker is cut at once
        waiting = list(slots)
        while waiting:
            if interruptor is not None and len(slots) - len(waiting) >= finish_first:
                interruptor.stop_collection()
            waiting.remove(self.pool.await_first_batch(waiting))


def _collected_frames(batch: TensorDictBase) -> int:
    """Frames of a preempted batch that were collected (as TorchRL counts them)."""
    mask = batch.get(keys.MASK, None)
    return batch.numel() if mask is None else int(mask.sum())

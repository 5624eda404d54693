"""`MultiAsyncCollector`: each worker's batch, yielded as soon as it is ready."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.collectors.devices import finish_cuda_copies
from rlcollect.collectors.multiprocess.base import MultiCollectorBase
from rlcollect.collectors.multiprocess.options import check_preemptive_threshold
from rlcollect.collectors.multiprocess.pool import WorkerSlot
from rlcollect.collectors.multiprocess.worker import WorkerCommand
from rlcollect.collectors.options import validate_frames


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class MultiAsyncCollector(MultiCollectorBase, torchrl_shorthand="async"):
    """Runs one collector per worker process and yields each worker's batch as it arrives.

    A worker starts its next batch as soon as its last one has been copied out, so slow
    workers never hold fast ones back. Batches of one worker come in order, with its
    trajectories continuing across them; with `track_worker_id=True` (ours; off by default, so
    batches carry exactly TorchRL's keys) every batch carries `("collector", "worker_id")`.
    Takes the arguments of `MultiSyncCollector`; `frames_per_batch` is what each worker
    collects per batch; a list (one entry per worker, as `MultiSyncCollector` takes it) is
    summed, as TorchRL does: every worker's batch holds the sum. `update_at_each_batch` sends the
    latest weights to a worker before it goes on. As in TorchRL, `cat_results` ("stack",
    None or an int) is accepted and means nothing here (each batch is one worker's), and
    `preemptive_threshold` is accepted and cuts nothing short (no worker waits for another).

    Examples:
        >>> from rlcollect.collectors import MultiAsyncCollector
        >>> with MultiAsyncCollector(
        ...     "CartPole-v1",
        ...     num_workers=2,
        ...     frames_per_batch=50,
        ...     total_frames=200,
        ...     track_worker_id=True,
        ... ) as collector:
        ...     worker_ids = [int(data["collector", "worker_id"][0]) for data in collector]
        >>> len(worker_ids), sorted(set(worker_ids))
        (4, [0, 1])
    """

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        track_worker_id: bool = False,
        **options: Any,
    ) -> None:
        cat_results = options.pop("cat_results", None)
        if not (cat_results in (None, "stack") or _is_int(cat_results)):
            raise ValueError(
                f"cat_results={cat_results!r} is not supported; use 'stack', None or an int "
                "(MultiAsyncCollector yields each worker's batch as it is, whichever)."
            )
        check_preemptive_threshold(options.pop("preemptive_threshold", None))
        if not isinstance(track_worker_id, bool):
            raise TypeError(f"track_worker_id must be True or False; got {track_worker_id!r}.")
        self.track_worker_id = track_worker_id
        frames = options.get("frames_per_batch")
        if isinstance(frames, list | tuple):
            # TorchRL's per-worker list: checked entry by entry (and against the workers, in
            # the base class), and each worker collects the sum.
            for value in frames:
                validate_frames(value, -1)
            options["frames_per_batch"] = [sum(int(value) for value in frames)] * len(frames)
        elif isinstance(frames, int) and not isinstance(frames, bool):
            num_workers = len(create_env_fn) if isinstance(create_env_fn, list | tuple) else None
            options["frames_per_batch"] = [frames] * (
                num_workers or options.get("num_workers") or 1
            )
        super().__init__(create_env_fn, policy, **options)
        self._turn = 0

    def _batch_frames(self) -> int:
        return max(slot.frames_per_batch for slot in self.pool.slots)

    def _round_total(self, total_frames: int) -> int:
        return total_frames  # batches of different workers may differ; no rounding

    def __len__(self) -> int:
        """The number of batches up to `total_frames` (the last may pass it, as in TorchRL);
        undefined when workers collect batches of different sizes (it depends on timing)."""
        sizes = {slot.frames_per_batch for slot in self.pool.slots}
        if self.total_frames <= 0 or len(sizes) > 1:
            raise TypeError(
                "len() is undefined for an endless collector, or when workers' batches differ "
                f"in size (here {sorted(sizes)}): the count depends on which finishes first."
            )
        return -(-self.total_frames // sizes.pop())

    def _launch(self, slot: WorkerSlot) -> None:
        """Ask `slot` for a batch unless the batches already on their way reach
        `total_frames` (so no batch is collected, or written to a buffer, past it)."""
        if self.total_frames > 0:
            on_the_way = sum(
                other.frames_per_batch
                for other in self.pool.slots
                if other.has_batch or WorkerCommand.COLLECT in other.pending
            )
            if self.frames + on_the_way >= self.total_frames:
                return
        self.pool.launch(slot, self.pool.deadline())

    def next(self) -> TensorDictBase | None:
        """Return the next batch any worker finishes (None when workers fill a buffer).

        Raises:
            StopIteration: when `total_frames` have been collected.
        """
        if self.is_done:
            raise StopIteration
        # The workers' pipes are read under the pool's lock, released while a batch is
        # awaited: a weight update from another thread goes in between.
        with self.pool.lock:
            self._before_batch()
            for slot in self.pool.slots:
                if WorkerCommand.COLLECT not in slot.pending and not slot.has_batch:
                    self._launch(slot)
            # Start the search after the worker served last, so that no worker is starved.
            order = self.pool.slots[self._turn :] + self.pool.slots[: self._turn]
        slot = self.pool.await_first_batch(order)
        with self.pool.lock:
            self._turn = (slot.index + 1) % self.num_workers
            batch = self._take(slot)
            if self.update_at_each_batch and self.weights.readable:
                self.update_policy_weights_(worker_ids=slot.index)
            if not self.is_done:
                self._launch(slot)
        return batch if batch is None else self._finish(batch)

    def _take(self, slot: WorkerSlot) -> TensorDictBase | None:
        """Count `slot`'s batch and copy it out of shared memory (the worker overwrites it
        with its next batch)."""
        slot.has_batch = False
        self.iterations += 1
        if self.options.replay_buffer is not None:
            return None  # the worker wrote the batch, and the pool counted it
        self._frames += slot.last_frames
        batch = slot.batch_with_extras().clone()
        finish_cuda_copies(batch)  # copied out before the worker, launched next, writes again
        if self.track_worker_id:
            batch.set(
                keys.WORKER_ID,
                torch.full(batch.batch_size, slot.index, dtype=torch.int64, device=batch.device),
            )
        return batch

"""Validation of the collector's options, and their translation into composed parts."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.batch.compact import StoreObservationsOnce
from rlcollect.batch.next_observations import DropNextObservations

Process = Callable[[TensorDictBase], TensorDictBase]


def check_int(name: str, value: Any) -> int:
    """`value` as an int, or a TypeError naming it."""
    if not keys.is_int(value):
        raise TypeError(f"{name} must be an int; got {value!r} ({type(value).__name__}).")
    return int(value)


def validate_frames(frames_per_batch: Any, total_frames: Any) -> tuple[int, int]:
    """Check `frames_per_batch` (> 0) and `total_frames` (> 0, or -1 for endless); as ints."""
    frames_per_batch = check_int("frames_per_batch", frames_per_batch)
    total_frames = check_int("total_frames", total_frames)
    if frames_per_batch <= 0:
        raise ValueError(
            f"frames_per_batch={frames_per_batch} must be a positive number of frames, "
            "e.g. frames_per_batch=1000."
        )
    if total_frames == 0 or total_frames < -1:
        raise ValueError(
            f"total_frames={total_frames} must be a positive number of frames, or -1 to "
            "collect forever."
        )
    return frames_per_batch, total_frames


def round_to_batches(argument: str, frames: int, frames_per_batch: int, stacklevel: int) -> int:
    """`frames` rounded up to whole batches (non-positive counts as they are), with a warning
    naming `argument` when that changes it."""
    if frames <= 0:
        return frames
    rounded = -(-frames // frames_per_batch) * frames_per_batch
    if rounded != frames:
        warnings.warn(
            f"{argument}={frames} is not a multiple of the batch of {frames_per_batch} "
            f"frames; using {argument}={rounded}.",
            stacklevel=stacklevel + 1,
        )
    return rounded


def optional_frames(name: str, value: Any) -> int | None:
    """An optional frame count: None or a negative int (TorchRL's -1) means "not set"."""
    if value is None:
        return None
    if not keys.is_int(value):
        raise TypeError(
            f"{name} must be an int, or None (or -1) to leave it unset; got {value!r} "
            f"({type(value).__name__})."
        )
    return int(value) if value > 0 else None


def is_private_key(key: str | tuple[str, ...]) -> bool:
    """Whether a key, or any part of a nested one, starts with "_" (e.g. "_reset")."""
    parts = (key,) if isinstance(key, str) else key
    return any(part.startswith("_") for part in parts)


def exclude_private_keys(batch: TensorDictBase) -> TensorDictBase:
    """The batch without its private entries: as in TorchRL, keys starting with "_" are the
    env's or a transform's own bookkeeping and are left out of what users receive."""
    private = [key for key in batch.keys(include_nested=True) if is_private_key(key)]
    return batch.exclude(*private) if private else batch


def exclude_trajectory_ids(batch: TensorDictBase) -> TensorDictBase:
    """The batch without `("collector", "traj_ids")` (TorchRL's `track_traj_ids=False`), and
    without the `"collector"` entry once it holds nothing else."""
    batch = batch.exclude(keys.TRAJ_IDS)
    collector = batch.get(keys.COLLECTOR, None)
    if collector is not None and collector.is_empty():
        batch = batch.exclude(keys.COLLECTOR)
    return batch


def _check_compact(compact_obs: Any, store_obs_once: Any, return_same_td: bool) -> None:
    if not isinstance(compact_obs, bool):
        raise TypeError(
            f"compact_obs must be True or False; got {compact_obs!r}. compact_obs=True leaves "
            "the ('next', <observation>) entries out (TorchRL's meaning); "
            "store_obs_once=True stores every observation once, losslessly."
        )
    if not isinstance(store_obs_once, bool):
        raise TypeError(f"store_obs_once must be True or False; got {store_obs_once!r}.")
    if compact_obs and store_obs_once:
        raise ValueError(
            "compact_obs=True and store_obs_once=True both store observations once, in two "
            "layouts: keep compact_obs=True for TorchRL's (the [*B, T] batch without its "
            "('next', <observation>) entries) or store_obs_once=True for ours ([*B] with T + 1 "
            "observations, nothing lost)."
        )
    if store_obs_once and return_same_td:
        raise ValueError(
            "store_obs_once=True builds a new batch every time, so there is no same "
            "TensorDict to return: drop return_same_td=True or store_obs_once=True."
        )


def _check_frame_by_frame(
    extend_buffer: bool, postproc: Any, split_trajs: bool, store_obs_once: bool
) -> None:
    """With `extend_buffer=False` each step is written alone, so nothing that needs the
    whole batch can run first (TorchRL refuses `postproc` and `split_trajs` likewise)."""
    if extend_buffer:
        return
    needs_batch = {
        "postproc": postproc is not None,
        "split_trajs": bool(split_trajs),
        "store_obs_once": bool(store_obs_once),
    }
    given = [name for name, is_set in needs_batch.items() if is_set]
    if given:
        raise TypeError(
            f"{given[0]} must be None/False when a replay buffer is written frame by frame "
            f"(extend_buffer=False): it needs the whole batch. Drop {given[0]}, or set "
            "extend_buffer=True to write whole batches."
        )


@dataclass
class CollectHook:
    """TorchRL's `post_collect_hook`: called with every finished batch, which passes on."""

    hook: Callable[[TensorDictBase], None]

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        self.hook(batch)
        return batch


@dataclass
class BufferWriter:
    """How batches reach the replay buffer: one `extend` per batch, or, with TorchRL's
    `extend_buffer=False`, every step as an item of its own (the env batch of that step), in
    time order (`add`, as TorchRL writes it; a worker's counting view counts it too).

    A batch without a device (a device-less env's, or one a `postproc` cleared) is given
    the buffer storage's device first, as TorchRL's collector does, so the storage never
    receives device-less data."""

    buffer: Any
    frame_by_frame: bool = False

    def extend(self, batch: TensorDictBase) -> None:
        if batch.device is None:
            device = getattr(getattr(self.buffer, "storage", None), "device", None)
            if isinstance(device, (str, torch.device)) and device != "auto":
                batch = batch.to(device)
        if not self.frame_by_frame:
            self.buffer.extend(batch)
            return
        write_step = write_one_step(self.buffer)
        time_dim = batch.batch_dims - 1
        for t in range(batch.shape[time_dim]):
            write_step(batch[(slice(None),) * time_dim + (t,)])


def write_one_step(buffer: Any) -> Callable[[TensorDictBase], Any]:
    """How `buffer` takes one step (the env batch of that step) as one item: TorchRL's
    `add`, as TorchRL's collector writes it (a multi-dim storage lays a step out along its
    second dim), or a one-item `extend` for a buffer without `add`."""
    add = getattr(buffer, "add", None)
    if callable(add):
        return add  # type: ignore[no-any-return]
    return lambda step: buffer.extend(step.unsqueeze(0))


@dataclass
class BatchOptions:
    """The per-batch options, validated: the post-processing pipeline and the sink."""

    pipeline: list[Process] = field(default_factory=list)
    replay_buffer: Any = None
    return_same_td: bool = False
    reset_at_each_iter: bool = False
    weight_recv_schemes: Mapping[str, Any] = field(default_factory=dict)
    # store_obs_once with nothing before it in the pipeline: straight from the carrier.
    store_once_at_delivery: bool = False
    # compact_obs (TorchRL's): the ("next", <observation>) entries are left out of batches.
    drop_next_observations: bool = False
    # What batches are written to `replay_buffer` through (None without one).
    buffer_writer: Any = None

    @classmethod
    def validate(
        cls,
        *,
        postproc: Process | None,
        split_trajs: bool,
        return_same_td: bool,
        replay_buffer: Any,
        extend_buffer: bool,
        weight_sync_schemes: Mapping[str, Any] | None,
        weight_recv_schemes: Mapping[str, Any] | None,
        reset_at_each_iter: bool = False,
        post_collect_hook: Callable[[TensorDictBase], None] | None = None,
        track_traj_ids: bool = True,
        compact_obs: bool = False,
        store_obs_once: bool = False,
    ) -> BatchOptions:
        """Check every option and build the pipeline `[compact_obs, split_trajs, postproc,
        store_obs_once, private keys out, trajectory ids out, post_collect_hook]`, in TorchRL's
        order (`store_obs_once` is ours: it loses nothing, so `postproc` sees the full batch)."""
        if replay_buffer is not None:
            cls._check_buffer(replay_buffer, return_same_td, extend_buffer)
            _check_frame_by_frame(extend_buffer, postproc, split_trajs, store_obs_once)
        if weight_sync_schemes:
            raise ValueError(
                "weight_sync_schemes is for collectors with children (multi-process, Ray); "
                "a single-process Collector only receives: use weight_recv_schemes."
            )
        schemes = dict(weight_recv_schemes or {})
        for name, scheme in schemes.items():
            if not callable(getattr(scheme, "receive", None)):
                raise TypeError(
                    f"weight_recv_schemes[{name!r}] must have a receive() method returning "
                    f"weights or None; got {type(scheme).__name__}."
                )
        _check_compact(compact_obs, store_obs_once, return_same_td)
        pipeline = cls._pipeline(split_trajs, postproc, track_traj_ids, post_collect_hook)
        if store_obs_once:
            pipeline.insert(int(split_trajs) + int(postproc is not None), StoreObservationsOnce())
        if compact_obs:  # TorchRL drops them at every step, before anything else sees the batch
            pipeline.insert(0, DropNextObservations())
        at_delivery = store_obs_once and not split_trajs and postproc is None
        writer = BufferWriter(replay_buffer, frame_by_frame=not extend_buffer)
        return cls(
            pipeline,
            replay_buffer,
            return_same_td,
            reset_at_each_iter,
            schemes,
            at_delivery,
            compact_obs,
            writer if replay_buffer is not None else None,
        )

    @staticmethod
    def _pipeline(
        split_trajs: bool,
        postproc: Process | None,
        track_traj_ids: bool,
        post_collect_hook: Callable[[TensorDictBase], None] | None,
    ) -> list[Process]:
        if postproc is not None and not callable(postproc):
            raise TypeError(f"postproc must be a callable batch -> batch; got {postproc!r}.")
        if post_collect_hook is not None and not callable(post_collect_hook):
            raise TypeError(
                f"post_collect_hook must be a callable taking the batch; got {post_collect_hook!r}."
            )
        if not isinstance(track_traj_ids, bool):
            raise TypeError(f"track_traj_ids must be True or False; got {track_traj_ids!r}.")
        if split_trajs and not track_traj_ids:
            raise ValueError(
                "split_trajs=True splits batches by trajectory id, so it needs "
                "track_traj_ids=True; drop one of the two."
            )
        pipeline: list[Process] = []
        if split_trajs:
            from rlcollect.transforms.split import SplitTrajectories

            pipeline.append(SplitTrajectories())
        if postproc is not None:
            pipeline.append(postproc)
        pipeline.append(exclude_private_keys)
        if not track_traj_ids:
            pipeline.append(exclude_trajectory_ids)
        if post_collect_hook is not None:
            pipeline.append(CollectHook(post_collect_hook))
        return pipeline

    @staticmethod
    def _check_buffer(replay_buffer: Any, return_same_td: bool, extend_buffer: bool) -> None:
        if not callable(getattr(replay_buffer, "extend", None)):
            raise TypeError(
                f"replay_buffer must have an extend() method; got {type(replay_buffer).__name__}."
            )
        if return_same_td:
            raise ValueError(
                "return_same_td=True cannot be used with replay_buffer: the buffer would "
                "receive the same TensorDict every batch. Drop one of the two."
            )
        if not isinstance(extend_buffer, bool):
            raise TypeError(f"extend_buffer must be True or False; got {extend_buffer!r}.")

    @property
    def post_collect_hook(self) -> Callable[[TensorDictBase], None] | None:
        """The hook called with every finished batch (TorchRL's attribute), or None."""
        hooks = [process for process in self.pipeline if isinstance(process, CollectHook)]
        return hooks[-1].hook if hooks else None

    def set_post_collect_hook(self, hook: Callable[[TensorDictBase], None] | None) -> None:
        """Replace the post-collect hook (None removes it); it stays last in the pipeline.

        Raises:
            TypeError: `hook` is neither None nor callable.
        """
        if hook is not None and not callable(hook):
            raise TypeError(
                f"post_collect_hook must be a callable taking the batch, or None; got {hook!r}."
            )
        self.pipeline = [p for p in self.pipeline if not isinstance(p, CollectHook)]
        if hook is not None:
            self.pipeline.append(CollectHook(hook))

    def run_first(self, steps: list[Process]) -> None:
        """Put `steps` at the head of the pipeline: they see every batch as collected (the
        trajectory views' steps, known once the env is built)."""
        self.pipeline[:0] = steps
        if steps:
            self.compact_at_delivery = False  # compaction comes after them

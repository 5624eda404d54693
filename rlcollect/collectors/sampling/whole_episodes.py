"""Batches of whole episodes: RLlib's `batch_mode="complete_episodes"` and TorchRL's
`trajs_per_batch`, as a room around the rollout loop.

The loop still collects fixed `[*B, T]` batches. `EpisodeAssembler` takes each one, keeps every
sub-env's running episode aside (its pieces, across as many batches as it lasts) and releases an
episode once it ends done. The collector then yields:

* `batch_mode="complete_episodes"`: every whole episode ready, once they hold at least
  `frames_per_batch` frames (a minimum: with 98-step episodes and 100 frames per batch, a batch
  holds 196 frames), concatenated along time: a flat `[frames]` batch, last dim "time",
  episodes contiguous and told apart by `("collector", "traj_ids")` and `("next", "done")`
  (`split_trajs=True` turns it into `[num_trajs, max_len]` with a mask);
* `trajs_per_batch=N`: exactly N whole episodes, oldest first, `traj_format="padded"`
  (`[N, max_len]`, zero-padded, `("collector", "mask")`) or `"cat"` (flat, as above).

Episodes still running when `total_frames` is reached are incomplete and not yielded.

Each worker of a multi-process collector and each Ray actor assembles its own episodes. Under
`trajs_per_batch=N`, `MultiSyncCollector` yields N episodes in all, as TorchRL's does: its workers
batch `ceil(N / W)` each, flat, and an `EpisodeQueue` hands them out N at a time. Otherwise the
gathering collectors (`MultiSyncCollector`, `RayCollector(sync=True)`, whose actors batch N each)
join one batch of each, whose lengths differ: flat ones concatenated along time (worker after
worker), padded ones padded to the longest episode and concatenated along trajectories. The
asynchronous ones yield each worker's batch as it is.
"""

from __future__ import annotations

import itertools
import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.batch.episodes import EpisodeJoiner
from rlcollect.transforms.split import split_trajectories

NestedKey = str | tuple[str, ...]
BATCH_MODES = ("truncate_episodes", "complete_episodes")
TRAJ_FORMATS = ("padded", "cat")


@dataclass(frozen=True)
class EpisodeMode:
    """How whole episodes are batched: `min_frames` (complete_episodes) or `count` episodes
    per batch (trajs_per_batch), in `layout` ("cat" or "padded"); `per_write` episodes per
    replay-buffer extend (None: each as soon as it ends)."""

    min_frames: int | None
    count: int | None
    layout: str
    per_write: int | None

    @classmethod
    def validate(
        cls,
        *,
        batch_mode: str | None,
        trajs_per_batch: int | None,
        traj_format: str | None,
        trajs_per_write: int | None,
        frames_per_batch: int,
        has_buffer: bool,
    ) -> EpisodeMode | None:
        """The mode the arguments ask for (None: fixed-size batches), or a ValueError naming
        the argument, its value and what is accepted."""
        _check_choices(batch_mode, traj_format)
        if trajs_per_batch is not None:
            _positive("trajs_per_batch", trajs_per_batch)
            if batch_mode == "truncate_episodes":
                raise ValueError(
                    "trajs_per_batch yields whole episodes, but batch_mode='truncate_episodes' "
                    "cuts them; drop batch_mode (or set it to 'complete_episodes')."
                )
        else:
            if traj_format is not None:
                raise ValueError(
                    f"traj_format={traj_format!r} shapes the batches of trajs_per_batch; set "
                    "trajs_per_batch too, or drop traj_format."
                )
            if trajs_per_write is not None:
                raise ValueError(
                    f"trajs_per_write={trajs_per_write!r} counts the episodes written per "
                    "replay-buffer extend under trajs_per_batch; set trajs_per_batch too."
                )
        if trajs_per_write is not None:
            _positive("trajs_per_write", trajs_per_write)
            if not has_buffer:
                raise ValueError(
                    f"trajs_per_write={trajs_per_write} counts episodes per replay-buffer "
                    "write; pass replay_buffer=... too, or drop it."
                )
        if trajs_per_batch is not None:
            if traj_format is None and not has_buffer:
                warnings.warn(
                    "trajs_per_batch without traj_format yields 'padded' batches ([N, max_len] "
                    "with ('collector', 'mask')), as TorchRL 0.14 does; TorchRL's default "
                    "will change to 'cat' in torchrl v0.16. Pass traj_format='padded' or "
                    "'cat' to choose, and silence this warning.",
                    FutureWarning,
                    stacklevel=4,
                )
            return cls(None, trajs_per_batch, traj_format or "padded", trajs_per_write)
        if batch_mode == "complete_episodes":
            return cls(frames_per_batch, None, "cat", None)
        return None


def _check_choices(batch_mode: str | None, traj_format: str | None) -> None:
    if batch_mode is not None and batch_mode not in BATCH_MODES:
        raise ValueError(f"batch_mode must be one of {BATCH_MODES}; got {batch_mode!r}.")
    if traj_format is not None and traj_format not in TRAJ_FORMATS:
        raise ValueError(
            f"traj_format must be 'padded' or 'cat' (the layout of trajs_per_batch's "
            f"episodes); got {traj_format!r}."
        )


def _positive(argument: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{argument} must be a positive integer; got {value!r}.")


class EpisodeAssembler:
    """Batches whole episodes: an `EpisodeJoiner` (`batch/episodes.py`) joins each
    trajectory's pieces across batches; this adds only the batching policy (how many
    episodes, or how many frames, make a batch, and in which layout).

    Args:
        mode: the `EpisodeMode`.
        done_keys: the done flags that end an episode (one per group).
    """

    def __init__(self, mode: EpisodeMode, done_keys: Sequence[NestedKey]) -> None:
        self.mode = mode
        self.joiner = EpisodeJoiner(end_keys=done_keys)
        self._ready: deque[TensorDictBase] = deque()
        self.ready_frames = 0

    @property
    def ready_episodes(self) -> int:
        return len(self._ready)

    def drop_running(self) -> None:
        """Forget the episodes in progress (the env was reset: they will not end)."""
        self.joiner.drop_running()

    def add(self, batch: TensorDictBase) -> None:
        """Take a `[*B, T]` batch with its trajectory ids (a copy the assembler may keep)."""
        for episode in self.joiner.add(batch):
            self._ready.append(episode.transitions)
            self.ready_frames += len(episode)

    def has_batch(self) -> bool:
        """Whether enough whole episodes are ready for one batch."""
        if self.mode.count is not None:
            return len(self._ready) >= self.mode.count
        return bool(self._ready) and self.ready_frames >= (self.mode.min_frames or 1)

    def take_batch(self) -> TensorDictBase:
        """The next batch of whole episodes, in the mode's layout."""
        count = self.mode.count if self.mode.count is not None else len(self._ready)
        return lay_out_episodes(self._take(count), self.mode.layout)

    def take_writes(self) -> list[TensorDictBase]:
        """What a replay buffer is extended with now, as TorchRL writes it: under
        trajs_per_batch, every whole episode ready, flat, `per_write` episodes per extend (all
        of them in one when None; the last extend may hold fewer); under complete_episodes,
        one flat run once `frames_per_batch` frames are ready."""
        if self.mode.count is None:
            if not self.has_batch():
                return []
            return [lay_out_episodes(self._take(len(self._ready)), "cat")]
        writes = []
        while self._ready:
            count = min(self.mode.per_write or len(self._ready), len(self._ready))
            writes.append(lay_out_episodes(self._take(count), "cat"))
        return writes

    def _take(self, count: int) -> list[TensorDictBase]:
        episodes = [self._ready.popleft() for _ in range(count)]
        self.ready_frames -= sum(episode.numel() for episode in episodes)
        return episodes


def lay_out_episodes(episodes: list[TensorDictBase], layout: str) -> TensorDictBase:
    """Flat episodes as one batch: concatenated along time ("cat"), or one zero-padded row
    each with `("collector", "mask")` ("padded")."""
    flat = cast(TensorDictBase, torch.cat(episodes, 0))  # type: ignore[arg-type]
    flat.refine_names(keys.TIME_DIM_NAME)
    if layout == "cat":
        return flat
    return split_trajectories(flat)


class EpisodeQueue:
    """TorchRL's `trajs_per_batch` over several workers: its batches hold `count` episodes in
    all, not `count` of each worker. The workers' flat runs of whole episodes (each episode
    contiguous, told apart by its trajectory id) queue here, oldest first, and leave `count`
    at a time in `layout`; what a round of the workers brings beyond a batch waits for the
    next one.

    Args:
        count: episodes per batch.
        layout: "padded" or "cat", as `traj_format`.
    """

    def __init__(self, count: int, layout: str) -> None:
        self.count = count
        self.layout = layout
        self._episodes: deque[TensorDictBase] = deque()

    @property
    def queued(self) -> int:
        return len(self._episodes)

    def add(self, flat: TensorDictBase) -> None:
        """Queue the episodes of a flat `[frames]` run (a worker's, or several in turn)."""
        if flat.numel() == 0:
            return
        ids = flat.get(keys.TRAJ_IDS).reshape(flat.shape[0], -1)[:, 0]
        starts = (torch.nonzero(ids[1:] != ids[:-1]).squeeze(-1) + 1).tolist()
        bounds = [0, *starts, flat.shape[0]]
        self._episodes.extend(flat[start:end] for start, end in itertools.pairwise(bounds))

    def has_batch(self) -> bool:
        return len(self._episodes) >= self.count

    def take_batch(self) -> TensorDictBase:
        """The oldest `count` episodes, laid out."""
        return lay_out_episodes([self._episodes.popleft() for _ in range(self.count)], self.layout)


def refuse_with_whole_episodes(
    mode: EpisodeMode | None,
    *,
    return_same_td: bool,
    reset_at_each_iter: bool,
    set_truncated: bool,
    split_trajs: bool,
    soft_horizon: bool,
    no_done_at_end: bool,
) -> None:
    """Refuse the options that make no sense with batches of whole episodes, saying why."""
    if mode is None:
        return
    reasons = {
        "return_same_td": "whole episodes are kept across batches, so each batch is new",
        "reset_at_each_iter": "a reset every batch would cut every episode that spans batches",
        "set_truncated": "a batch cut marked done would end episodes that did not end",
        "soft_horizon": "a soft horizon never ends an episode done, so none would be whole",
        "no_done_at_end": "no episode would ever end done, so none would be whole",
    }
    given = {
        "return_same_td": return_same_td,
        "reset_at_each_iter": reset_at_each_iter,
        "set_truncated": set_truncated,
        "soft_horizon": soft_horizon,
        "no_done_at_end": no_done_at_end,
    }
    what = "trajs_per_batch" if mode.count is not None else "batch_mode='complete_episodes'"
    for name, value in given.items():
        if value:
            raise ValueError(f"{name}=True cannot be used with {what}: {reasons[name]}.")
    if split_trajs and mode.count is not None:
        raise ValueError(
            "split_trajs=True cannot be used with trajs_per_batch: its batches are already "
            "one row per trajectory (traj_format='padded'); drop split_trajs."
        )

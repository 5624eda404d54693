"""SliceSampler: batches of consecutive steps that never cross a trajectory boundary."""

from __future__ import annotations

from typing import Any

import torch

from rlcollect import keys
from rlcollect.errors import MisuseError
from rlcollect.keys import DONE, NEXT, TERMINATED, TRAJ_IDS, TRUNCATED
from rlcollect.replay.samplers import Sampler, window_slots
from rlcollect.replay.storage import Storage

NestedKey = str | tuple[str, ...]


class SliceSampler(Sampler):
    """Draws ``num_slices`` slices of ``slice_len`` consecutive steps, each inside one trajectory.

    Trajectories are read in storage order from the oldest item to the newest, so a trajectory
    that wraps around the end of the circular storage stays whole, and the newest item never
    joins the oldest. They are split where ``traj_key`` changes value or after each step whose
    ``end_key`` is set. Each slice picks a trajectory uniformly among those long enough, then a
    start uniformly within it. The sample is flat (``[num_slices * slice_len]``, slice after
    slice); ``truncated_key`` marks the last step of every slice (and its ``"done"`` sibling is
    OR-ed with it), so value estimators see where slices end.

    A `[B, T]` batch is stored row after row, so without trajectory ids the end of one env's
    row runs into the next row's start unless a done flag separates them: store collector
    batches (they carry ``("collector", "traj_ids")``), or mark each row's last step done.

    Keyword Args:
        num_slices: the number of slices per batch (then ``slice_len = batch_size // num_slices``).
        slice_len: the length of each slice (then ``num_slices = batch_size // slice_len``).
            Exactly one of the two is given; the batch size must be a multiple of it.
        traj_key: the trajectory-id entry. Defaults to ``("collector", "traj_ids")`` when stored.
        end_key: the end-of-trajectory flag entry, used when no ``traj_key`` is given or found.
            Defaults to ``("next", "done")``.
        strict_length: only draw from trajectories of at least ``slice_len`` steps; if False,
            shorter ones give shorter slices (and a smaller batch). Defaults to True.
        truncated_key: where to mark the ends of slices in the sample; ``None`` to not mark them.
            Defaults to ``("next", "truncated")``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from rlcollect.replay import LazyTensorStorage, ReplayBuffer, SliceSampler
        >>> steps = TensorDict(
        ...     {"collector": {"traj_ids": torch.tensor([0] * 6 + [1] * 4)}, "t": torch.arange(10)},
        ...     batch_size=[10],
        ... )
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(100), sampler=SliceSampler(slice_len=3))
        >>> _ = rb.extend(steps)
        >>> batch = rb.sample(12).reshape(4, 3)
        >>> bool((batch["collector", "traj_ids"] == batch["collector", "traj_ids"][:, :1]).all())
        True
        >>> bool((batch["t"].diff(dim=1) == 1).all())
        True
    """

    def __init__(
        self,
        *,
        num_slices: int | None = None,
        slice_len: int | None = None,
        traj_key: NestedKey | None = None,
        end_key: NestedKey | None = None,
        strict_length: bool = True,
        truncated_key: NestedKey | None = (NEXT, TRUNCATED),
    ) -> None:
        if (num_slices is None) == (slice_len is None):
            raise ValueError(
                f"pass exactly one of num_slices and slice_len, got num_slices={num_slices} and "
                f"slice_len={slice_len}."
            )
        given = num_slices if num_slices is not None else slice_len
        if isinstance(given, bool) or not isinstance(given, int) or given <= 0:
            raise ValueError(f"num_slices / slice_len must be a positive int, got {given!r}.")
        if traj_key is not None and end_key is not None:
            raise ValueError("pass traj_key or end_key, not both: trajectories are split by one.")
        self.num_slices = num_slices
        self.slice_len = slice_len
        self._divisor: int = given
        self.traj_key = traj_key
        self.end_key = end_key
        self.strict_length = strict_length
        self.truncated_key = truncated_key
        self._cache: tuple[Any, torch.Tensor, torch.Tensor] | None = None

    def check_batch_size(self, batch_size: int) -> None:
        divisor = self._divisor
        if batch_size % divisor:
            name = "num_slices" if self.num_slices is not None else "slice_len"
            raise ValueError(
                f"batch_size={batch_size} is not a multiple of {name}={divisor}; use a multiple "
                f"such as {batch_size - batch_size % divisor + divisor}."
            )

    def _slice_shape(self, batch_size: int) -> tuple[int, int]:
        self.check_batch_size(batch_size)
        if self.num_slices is not None:
            return self.num_slices, batch_size // self.num_slices
        return batch_size // self._divisor, self._divisor

    def _boundary_column(
        self, storage: Storage, positions: torch.Tensor
    ) -> tuple[bool, torch.Tensor]:
        slots = window_slots(storage, positions)
        if self.end_key is None:
            key = self.traj_key if self.traj_key is not None else TRAJ_IDS
            try:
                return True, storage.read_column(key, slots).reshape(len(slots), -1)[:, 0]
            except KeyError:
                if self.traj_key is not None:
                    raise
        key = self.end_key if self.end_key is not None else (NEXT, DONE)
        return False, storage.read_column(key, slots).reshape(len(slots), -1)[:, 0].bool()

    def trajectories(self, storage: Storage) -> tuple[torch.Tensor, torch.Tensor]:
        """The window positions where trajectories start, and their lengths (oldest first)."""
        state = storage.log.snapshot()
        if self._cache is not None and self._cache[0] == state:
            return self._cache[1], self._cache[2]
        length = state[1]
        is_id, column = self._boundary_column(storage, torch.arange(length))
        # A trajectory starts where the id changes, or right after an end flag.
        new = column[1:] != column[:-1] if is_id else column[:-1]
        starts = torch.cat([torch.zeros(1, dtype=torch.long), new.nonzero().reshape(-1) + 1])
        lengths = torch.diff(starts, append=torch.tensor([length]))
        self._cache = (state, starts, lengths)
        return starts, lengths

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[Any, Any]]:
        num_slices, slice_len = self._slice_shape(batch_size)
        starts, lengths = self.trajectories(storage)
        eligible = (lengths >= slice_len).nonzero().reshape(-1)
        if not self.strict_length:
            eligible = torch.arange(len(lengths))
        if eligible.numel() == 0:
            raise MisuseError(
                f"no stored trajectory has {slice_len} steps (the longest has "
                f"{int(lengths.max())}); sample shorter slices, store more steps, or pass "
                "strict_length=False."
            )
        chosen = eligible[torch.randint(eligible.numel(), (num_slices,), generator=self.generator)]
        sizes = lengths[chosen].clamp(max=slice_len)
        room = (lengths[chosen] - sizes + 1).to(torch.float64)
        offsets = (
            torch.rand(num_slices, generator=self.generator, dtype=torch.float64) * room
        ).long()
        firsts = starts[chosen] + offsets
        ends = sizes.cumsum(0)
        slice_of_step = torch.repeat_interleave(torch.arange(num_slices), sizes)
        step_in_slice = torch.arange(int(ends[-1])) - (ends - sizes)[slice_of_step]
        slots = window_slots(storage, firsts[slice_of_step] + step_in_slice)
        return slots, self._markers(storage, slots, ends - 1)

    def _markers(
        self, storage: Storage, slots: torch.Tensor, last_steps: torch.Tensor
    ) -> dict[Any, Any]:
        if self.truncated_key is None:
            return {}
        truncated = torch.zeros(len(slots), 1, dtype=torch.bool)
        truncated[last_steps] = True
        done_key = keys.sibling_key(self.truncated_key, DONE)
        terminated_key = keys.sibling_key(self.truncated_key, TERMINATED)
        info: dict[Any, Any] = {self.truncated_key: truncated}
        try:
            stored_done = storage.read_column(done_key, slots).reshape(len(slots), 1).bool()
            info[done_key] = stored_done | truncated
        except KeyError:
            info[done_key] = truncated.clone()
        try:
            info[terminated_key] = storage.read_column(terminated_key, slots).reshape(len(slots), 1)
        except KeyError:
            info[terminated_key] = torch.zeros_like(truncated)
        return info

    def empty(self) -> None:
        self._cache = None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._cache = None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_slices={self.num_slices}, slice_len={self.slice_len}, "
            f"traj_key={self.traj_key}, end_key={self.end_key})"
        )

"""`ViewWriter`: fills a carrier's trajectory-view columns at every step, before the policy.

Each view reads a window of the last values of its source per sub-env. Within a batch the
carrier is the history: after the env step at t, the window at root t + 1 is the window at t
moved by one step plus the newest value (the observation at t + 1 or t, the action or reward
at t), and the sub-envs that were reset restart theirs (the first observation repeated, or
the pad). Slot T of the carrier holds the window the next batch starts from, and it carries
over as the observations do: that is the per-env history across batch boundaries.

Every per-step operand is a view prepared once, as NumPy views on CPU (a copy between tiny
arrays costs well under a microsecond there, against a few for a torch op) and as tensors
elsewhere; a step is a handful of copies, and a masked copy where an episode ended.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.collectors.sampling.view_requirements import ViewColumn

Pairs = list[tuple[Any, Any]]


def _tensor_copy(target: torch.Tensor, value: torch.Tensor) -> None:
    target.copy_(value)


def _slot(batch_dims: int, *rest: Any) -> tuple[Any, ...]:
    """The index of `rest` past the env batch dims (e.g. time t, then a window entry)."""
    return (slice(None),) * batch_dims + rest


def _step(batch_dims: int, t: int, *rest: Any) -> tuple[Any, ...]:
    """The index of step `t` (kept as a dim of 1, so that even a scalar entry of a single
    env gives a view, not a copy), then `rest`."""
    return _slot(batch_dims, slice(t, t + 1), *rest)


def window_of(carrier: TensorDictBase, column: ViewColumn, time_dim: int) -> torch.Tensor:
    """`[*B, T + 1, span, *feature]`: the column a view's window lives in."""
    tensor = carrier.get(column.window_key)
    if column.is_window and not column.stacked:
        return tensor.unsqueeze(time_dim + 1)
    return tensor


def start_views(
    columns: Sequence[ViewColumn], carrier: TensorDictBase, time_dim: int, t: int
) -> None:
    """Every sub-env starts an episode at root `t`: each view holds the episode's first
    observation (observation views) or its pad at every offset."""
    batch = carrier.shape[:time_dim]
    for column in columns:
        window = window_of(carrier, column, time_dim).select(time_dim, t)
        if column.repeats_first:
            value = carrier.get(column.source).select(time_dim, t)
        else:
            value = column.pad.to(window.device).expand((*batch, *column.feature_shape))
        window.copy_(value.unsqueeze(time_dim).expand_as(window))
        if not column.is_window:
            picks = torch.tensor(column.picks, device=window.device)
            picked = window.index_select(time_dim, picks)
            view = carrier.get(column.name).select(time_dim, t)
            view.copy_(picked if column.stacked else picked.squeeze(time_dim))


class ViewWriter:
    """The per-step part that writes the views of `columns` into `carrier` (`[*B, T + 1]`).

    Contract: `start(t)` makes every sub-env start an episode at root `t` (a reset);
    `__call__(t)`, run right after the env step at t, writes the views at root `t + 1`
    (restarting those of the sub-envs whose trajectory ended at t: done, or cut by a soft
    horizon without a reset); `after(step)` composes itself after an env step callable.

    Raises:
        ValueError: at construction, when a view's source is missing from the carrier or
            does not have the shape and dtype of its space.
    """

    def __init__(
        self,
        columns: Sequence[ViewColumn],
        carrier: TensorDictBase,
        time_dim: int,
        end_flags: Sequence[torch.Tensor],
        ended_at: Callable[[int], torch.Tensor],
    ) -> None:
        self.columns = list(columns)
        self.carrier = carrier
        self.time_dim = time_dim
        self.steps = carrier.shape[time_dim] - 1
        self._end_flags = list(end_flags)
        self._ended_at = ended_at
        self._sources = [self._checked_source(column) for column in self.columns]
        batch = carrier.shape[:time_dim]
        self._pads = [
            column.pad.to(self._sources[i].device)
            .expand((*batch, *column.feature_shape))
            .unsqueeze(time_dim)
            .contiguous()
            for i, column in enumerate(self.columns)
        ]
        # Built at the first batch, once the env is bound: binding may move the carrier's
        # storage (into shared memory), which NumPy views would not follow.
        self._moves: list[Pairs] = []
        self._picks: list[Pairs] = []

    def _checked_source(self, column: ViewColumn) -> torch.Tensor:
        source = self.carrier.get(column.source, None)
        where = f"view_requirements[{column.name!r}]: data_col {keys.plain_key(column.source)!r}"
        if not isinstance(source, torch.Tensor):
            root = sorted(map(str, self.carrier.exclude("next").keys(True, True)))
            raise ValueError(
                f"{where} is neither an entry of the env nor an output of the policy; the "
                f"root holds {root}."
            )
        if source.shape != (*self.carrier.shape, *column.feature_shape) or (
            source.dtype != column.pad.dtype
        ):
            raise ValueError(
                f"{where} is {source.dtype} of shape {tuple(source.shape[self.time_dim + 1 :])} "
                f"per frame; its space says {column.pad.dtype} of shape "
                f"{tuple(column.feature_shape)}. Give the space of what the policy writes."
            )
        return source

    def _window(self, column: ViewColumn) -> torch.Tensor:
        return window_of(self.carrier, column, self.time_dim)

    # --- episode starts -------------------------------------------------------------------------

    def start(self, t: int) -> None:
        """Every sub-env starts an episode at root `t`: the views see only its first step."""
        start_views(self.columns, self.carrier, self.time_dim, t)

    # --- the per-step part ----------------------------------------------------------------------

    def after(self, step: Callable[[int], None]) -> Callable[[int], None]:
        """`step` followed by this writer: the env step callable of a carrier with views."""
        if not self._moves:
            self._prepare()

        def step_and_view(t: int) -> None:
            step(t)
            self(t)

        return step_and_view

    def __call__(self, t: int) -> None:
        copy = self._copy
        for target, value in self._moves[t]:
            copy(target, value)
        ended = self._ended(t)
        if self._any(ended):
            self._restart(t + 1, ended)
        for target, value in self._picks[t]:
            copy(target, value)

    def _restart(self, t: int, ended: Any) -> None:
        """The sub-envs in `ended` (shaped `[*B]` or `[*B, 1]`) start an episode at root `t`."""
        nb = self.time_dim
        index = _slot(nb, t)
        if isinstance(ended, torch.Tensor) and self._on_numpy:
            ended = ended.numpy()
        for window, source, pad, column in self._restart_parts:
            target = window[index]
            mask = ended.reshape(*ended.shape[:nb], *([1] * (target.ndim - nb)))
            value = self._unsqueeze(source[index], nb) if column.repeats_first else pad
            if self._on_numpy:
                np.copyto(target, value, where=mask)
            else:
                target.copy_(torch.where(mask, torch.as_tensor(value), target))

    def _prepare(self) -> None:
        """The per-step operands, as NumPy views of the carrier on CPU, tensors elsewhere."""
        on_cpu = self.carrier.get(self.columns[0].window_key).device.type == "cpu"
        try:
            self._prepare_on(numpy=on_cpu)
        except TypeError:  # a dtype NumPy lacks (bfloat16): torch throughout
            self._prepare_on(numpy=False)

    def _prepare_on(self, numpy: bool) -> None:
        self._on_numpy = numpy
        array = self._array
        windows = [array(self._window(column)) for column in self.columns]
        sources = [array(source) for source in self._sources]
        pads = [array(pad) for pad in self._pads]
        views = [array(self.carrier.get(column.name)) for column in self.columns]
        self._copy: Callable[[Any, Any], None] = np.copyto if numpy else _tensor_copy
        self._unsqueeze = np.expand_dims if numpy else torch.unsqueeze
        self._restart_parts = list(zip(windows, sources, pads, self.columns, strict=True))
        self._ended, self._any = self._end_flag_views()
        moves: list[Pairs] = [[] for _ in range(self.steps)]
        picks: list[Pairs] = [[] for _ in range(self.steps)]
        for column, window, source, view in zip(self.columns, windows, sources, views, strict=True):
            for t in range(self.steps):
                moves[t] += self._window_moves(column, window, source, t)
                if not column.is_window:
                    picks[t] += self._view_picks(column, window, view, t)
        self._moves, self._picks = moves, picks

    def _array(self, tensor: torch.Tensor) -> Any:
        return tensor.numpy() if self._on_numpy else tensor

    def _end_flag_views(self) -> tuple[Callable[[int], Any], Callable[[Any], Any]]:
        """`t -> flags` and the test of whether any is set: the done flag's views at every t
        when there is one `[*B, 1]` flag (the common case), else the layout's `ended_at`
        (several groups, or done and a soft horizon's truncated).

        NumPy's `count_nonzero` answers in under a microsecond, `any()` in about four.
        """
        flags = self._end_flags
        nb = self.time_dim
        if len(flags) == 1 and flags[0].shape[nb + 1 :].numel() == 1:
            flag = self._array(flags[0])
            views = [flag[_step(nb, t)] for t in range(self.steps)]
            return views.__getitem__, np.count_nonzero if self._on_numpy else torch.Tensor.any
        return self._ended_at, torch.Tensor.any

    def _window_moves(self, column: ViewColumn, window: Any, source: Any, t: int) -> Pairs:
        """Window at t + 1 = window at t moved by one, plus the newest value."""
        nb, span = self.time_dim, column.span
        moves = []
        if span > 1:
            moves.append(
                (window[_step(nb, t + 1, slice(0, span - 1))], window[_step(nb, t, slice(1, span))])
            )
        moves.append((window[_step(nb, t + 1, span - 1)], source[_step(nb, t + 1 + column.newest)]))
        return moves

    def _view_picks(self, column: ViewColumn, window: Any, view: Any, t: int) -> Pairs:
        """View at t + 1 = the window's entries at its offsets (a view that is not a window)."""
        nb = self.time_dim
        if not column.stacked:
            return [(view[_step(nb, t + 1)], window[_step(nb, t + 1, column.picks[0])])]
        return [
            (view[_step(nb, t + 1, k)], window[_step(nb, t + 1, pick)])
            for k, pick in enumerate(column.picks)
        ]

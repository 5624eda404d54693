"""The collector's trajectory views, resolved once at construction: `TrajectoryViews`.

Each view the policy reads becomes a `ViewColumn` of the carrier's root, which `ViewWriter`
(`view_writer.py`) fills at every step before the policy runs. A view with a future offset
(RLlib's `"next_actions"`, `used_for_compute_actions=False`) is built on every batch after
collection (`ShiftedView`), and the views marked `used_for_training=False` are left out of it.

What a view may read at inference: the env's root entries (observations, flags) up to shift 0,
the policy's outputs (actions, ...) and the `"next"` entries (rewards, ...) up to shift -1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase, unravel_key

from rlcollect import keys
from rlcollect.collectors.sampling.view_requirements import (
    RLLIB_COLUMNS,
    ViewColumn,
    ViewRequirement,
    parse_shift,
)
from rlcollect.collectors.sampling.view_writer import ViewWriter, start_views
from rlcollect.transforms.shift import ShiftedView

NestedKey = str | tuple[str, ...]


def _checked_name(name: Any) -> NestedKey:
    try:
        key = unravel_key(name)
    except (RuntimeError, TypeError) as err:
        raise TypeError(
            f"view_requirements keys are the view names (a string or a tuple of strings); "
            f"got {name!r}."
        ) from err
    parts = keys.as_tuple_key(key)
    if parts[0] in (keys.NEXT, keys.COLLECTOR) or any(part.startswith("_") for part in parts):
        raise ValueError(
            f"view_requirements[{name!r}]: a view is a root entry of the batch; its name may "
            f"not start with '_' nor lie under {keys.NEXT!r} or {keys.COLLECTOR!r}. Name it "
            "e.g. 'prev_actions'."
        )
    return key


def _zero_of(space: Any, view: NestedKey) -> torch.Tensor:
    """The zero of a spec (anything with `zero()`) or of a Gymnasium space."""
    spec = space
    if not callable(getattr(space, "zero", None)):
        try:
            from rlcollect.envs.gym_spaces import spec_from_space

            spec = spec_from_space(space)
        except (ImportError, TypeError, ValueError, NotImplementedError) as err:
            raise TypeError(
                f"view_requirements[{view!r}]: space must be a spec (with zero()) or a "
                f"Gymnasium space; got {space!r}."
            ) from err
    value = spec.zero()
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"view_requirements[{view!r}]: space must describe one tensor; its zero is "
            f"{type(value).__name__}. Give one view per leaf."
        )
    return value


@dataclass
class TrajectoryViews:
    """The resolved views of a collector: columns written at inference, and the batch steps
    (training-only views, columns left out) that run on every batch."""

    columns: list[ViewColumn]
    training: list[ShiftedView]
    unstored: list[NestedKey]

    @classmethod
    def resolve(cls, requirements: Any, policy: Any, env: Any) -> TrajectoryViews | None:
        """Merge the policy's `view_requirements` with the collector's and check them against
        the env (None when there are none).

        Raises:
            TypeError, ValueError: naming the view, what it asked for and what would do.
        """
        merged = _merge(_declared_by(policy), requirements)
        if not merged:
            return None
        env_frame = _EnvFrame(env)
        views = cls([], [], [])
        for name, requirement in merged.items():
            views._add(_checked_name(name), requirement, env_frame)
        return views

    def _add(self, name: NestedKey, requirement: ViewRequirement, env_frame: _EnvFrame) -> None:
        """File one view: as a column written at inference, a training-only step, or neither
        (a view of an entry as it is)."""
        source = _source(name, requirement, env_frame.present)
        offsets, stacked = parse_shift(requirement.shift, name)
        if not (requirement.used_for_compute_actions or requirement.used_for_training):
            raise ValueError(
                f"view_requirements[{name!r}] is used neither to compute actions nor for "
                "training; drop it."
            )
        if not requirement.used_for_training:
            self.unstored.append(name)
        if source == keys.as_tuple_key(name) and offsets == (0,) and not stacked:
            return  # the entry itself (RLlib's {"obs": ViewRequirement()})
        latest = 0 if source in env_frame.root_entries else -1
        if max(offsets) > latest:
            if requirement.used_for_compute_actions:
                raise ValueError(_future_message(name, requirement.shift, source, latest))
            shift = list(offsets) if stacked else offsets[0]
            self.training.append(ShiftedView(keys.plain_key(source), shift, out_key=name))
            return
        if env_frame.frame.get(name, None) is not None:
            raise ValueError(
                f"view_requirements[{name!r}]: {name!r} is already an entry of the env's frame; "
                "name the view after what it holds, e.g. 'prev_actions'."
            )
        feature, pad = env_frame.feature_and_pad(name, requirement, source)
        column = ViewColumn(
            name=name,
            source=source,
            offsets=offsets,
            stacked=stacked,
            newest=max(max(offsets), -1),
            repeats_first=source in env_frame.observations,
            pad=pad,
            feature_shape=feature,
        )
        self.columns.append(column)

    @property
    def input_keys(self) -> list[tuple[str, ...]]:
        """The columns the policy may read (a plain module's forward may name them)."""
        return [keys.as_tuple_key(column.name) for column in self.columns]

    @property
    def carry_keys(self) -> list[NestedKey]:
        """The root columns that carry from one batch to the next: the windows (the per-env
        history) and the views picked from them."""
        carried: list[NestedKey] = []
        for column in self.columns:
            carried += [column.window_key] if column.is_window else [column.window_key, column.name]
        return carried

    def add_columns(self, frame: TensorDictBase) -> None:
        """Add the zero-filled view columns (and private windows) to one frame of the env."""
        batch = frame.batch_size
        for column in self.columns:
            dtype, device = column.pad.dtype, frame.device or column.pad.device
            stack = (len(column.offsets),) if column.stacked else ()
            frame.set(
                column.name,
                torch.zeros((*batch, *stack, *column.feature_shape), dtype=dtype, device=device),
            )
            if not column.is_window:
                shape = (*batch, column.span, *column.feature_shape)
                frame.set(column.window_key, torch.zeros(shape, dtype=dtype, device=device))

    def start(self, carrier: TensorDictBase, time_dim: int, t: int) -> None:
        """Every sub-env starts an episode at root `t` of `carrier` (e.g. the env's reset)."""
        start_views(self.columns, carrier, time_dim, t)

    def writer(
        self,
        carrier: TensorDictBase,
        time_dim: int,
        end_flags: Sequence[torch.Tensor],
        ended_at: Callable[[int], torch.Tensor],
    ) -> ViewWriter:
        """The per-step part over `carrier`; `end_flags` are the flags that end a trajectory
        (`("next", "done")`, one per group, and under a soft horizon `("next", "truncated")`:
        RLlib starts a new episode at that cut, so the views restart as at a reset) and
        `ended_at(t)` which sub-envs ended a trajectory at t."""
        return ViewWriter(self.columns, carrier, time_dim, end_flags, ended_at)

    def batch_steps(self) -> list[Any]:
        """The steps every batch goes through first: training-only views, then unstored
        columns out."""
        steps: list[Any] = list(self.training)
        if self.unstored:
            steps.append(ExcludeColumns(self.unstored))
        return steps


@dataclass
class ExcludeColumns:
    """Leaves the views marked `used_for_training=False` out of a batch."""

    names: list[NestedKey]

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        return batch.exclude(*self.names)


def _declared_by(policy: Any) -> Any:
    """The policy's `view_requirements` (or those of the module a TensorDictModule wraps)."""
    for holder in (policy, getattr(policy, "module", None)):
        declared = getattr(holder, "view_requirements", None)
        if declared is not None:
            return declared
    return None


def _merge(declared: Any, given: Any) -> dict[Any, ViewRequirement]:
    merged: dict[Any, ViewRequirement] = {}
    for origin, requirements in (("the policy's", declared), ("the collector's", given)):
        if requirements is None:
            continue
        if not isinstance(requirements, Mapping):
            raise TypeError(
                f"{origin} view_requirements must be a dict of view name -> ViewRequirement; "
                f"got {type(requirements).__name__}."
            )
        for name, requirement in requirements.items():
            if not isinstance(requirement, ViewRequirement):
                raise TypeError(
                    f"view_requirements[{name!r}] must be a ViewRequirement; got "
                    f"{requirement!r}. E.g. ViewRequirement('action', shift=-1)."
                )
            if merged.get(name, requirement) != requirement:
                raise ValueError(
                    f"view_requirements[{name!r}] is {merged[name]} on the policy and "
                    f"{requirement} on the collector; give it once."
                )
            merged[name] = requirement
    return merged


def _source(
    name: NestedKey, requirement: ViewRequirement, present: set[tuple[str, ...]]
) -> tuple[str, ...]:
    """The carrier key a view reads: a frame entry, a `"next"` entry, an RLlib column, or (with
    a space) a policy output."""
    data_col = name if requirement.data_col is None else requirement.data_col
    try:
        key = keys.as_tuple_key(unravel_key(data_col))
    except (RuntimeError, TypeError) as err:
        raise TypeError(
            f"view_requirements[{name!r}]: data_col must be a key; got {data_col!r}."
        ) from err
    if key[0] == keys.COLLECTOR:
        raise ValueError(
            f"view_requirements[{name!r}]: data_col={data_col!r} is the collector's own "
            "bookkeeping, written after the batch; views read env and policy entries."
        )
    alias = RLLIB_COLUMNS.get(key[0], ()) if len(key) == 1 else ()
    for candidate in (key, (keys.NEXT, *key), alias):
        if candidate in present:
            return candidate
    if requirement.space is not None:
        return key  # a policy output; checked once the policy has run
    known = sorted(map(str, map(keys.plain_key, present - {keys.TRAJ_IDS})))
    raise ValueError(
        f"view_requirements[{name!r}]: data_col={data_col!r} is not an entry of the env's "
        f"frame {known} nor one of RLlib's columns {sorted(RLLIB_COLUMNS)}. For an entry "
        "the policy writes (other than its action), pass space= with its per-frame spec."
    )


def _future_message(name: NestedKey, shift: Any, source: tuple[str, ...], latest: int) -> str:
    what = keys.plain_key(source)
    if latest == 0:
        known = f"{what!r} is known up to shift 0 (the current step)"
    else:
        known = f"{what!r} is written by this very step, so it is known up to shift -1"
    return (
        f"view_requirements[{name!r}]: shift={shift!r} reads {what!r} ahead of what the "
        f"policy can see when it acts: {known}; a positive shift at inference looks into the "
        "future. For a training-only column (e.g. RLlib's 'next_actions'), pass "
        "ViewRequirement(..., used_for_compute_actions=False): it is added to the batch after "
        "collection."
    )


class _EnvFrame:
    """What the views are checked against: one zero frame of the env and its key groups."""

    def __init__(self, env: Any) -> None:
        self.frame = env.fake_tensordict()
        self.batch_dims = len(env.batch_size)
        leaves = self.frame.keys(include_nested=True, leaves_only=True)
        self.present = {keys.as_tuple_key(key) for key in leaves}
        self.observations = {keys.as_tuple_key(key) for key in env.observation_keys}
        # What the env writes at the root (readable at shift 0 when the policy acts).
        self.root_entries = self.observations | {keys.as_tuple_key(key) for key in env.done_keys}

    def feature_and_pad(
        self, name: NestedKey, requirement: ViewRequirement, source: tuple[str, ...]
    ) -> tuple[torch.Size, torch.Tensor]:
        """The per-frame shape of a view's data and its value before an episode's start."""
        if source not in self.present:  # a policy output, described by its space
            pad = _zero_of(requirement.space, name)
            return pad.shape, pad
        data = self.frame.get(keys.plain_key(source))
        feature, dtype = data.shape[self.batch_dims :], data.dtype
        if requirement.space is None:
            return feature, torch.zeros(feature, dtype=dtype, device=data.device)
        pad = _zero_of(requirement.space, name)
        if pad.shape not in (feature, torch.Size([*self.frame.batch_size, *feature])):
            raise ValueError(
                f"view_requirements[{name!r}]: the space's zero has shape {tuple(pad.shape)}; "
                f"{keys.plain_key(source)!r} has {tuple(feature)} per frame. Give the per-frame "
                "space of that entry."
            )
        return feature, pad.to(dtype=dtype, device=data.device)

"""`ViewRequirement` (RLlib's trajectory views): what a policy reads besides the current
observation, e.g. the previous action, the previous reward or the last k observations.

A policy declares them (a `view_requirements` attribute) or the collector is given them
(`view_requirements=`); `trajectory_views.py` resolves them against the env and `view_writer.py`
writes them at every step. In the batch, a view is a root entry named after it:
`[*env_batch, T, *feature]` for an int shift, `[*env_batch, T, K, *feature]` for a list of K
offsets or a range string (in the order given, stacked right after time, as `ShiftedView` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rlcollect import keys

NestedKey = str | tuple[str, ...]

# Where the windows of views that pick from them live: a private root entry (keys starting
# with "_" never reach a yielded batch).
WINDOW_GROUP = "_view_window"

Shift = int | str | Sequence[int]

# RLlib's column names, for users who bring their view requirements from RLlib.
RLLIB_COLUMNS: dict[str, tuple[str, ...]] = {
    "obs": (keys.OBSERVATION,),
    "new_obs": (keys.NEXT, keys.OBSERVATION),
    "actions": (keys.ACTION,),
    "rewards": (keys.NEXT, keys.REWARD),
    "dones": (keys.NEXT, keys.DONE),
    "terminateds": (keys.NEXT, keys.TERMINATED),
    "truncateds": (keys.NEXT, keys.TRUNCATED),
}
_SHIFT_FORMS = 'an int (-1), a list of ints ([-2, -1]) or an inclusive range string ("-3:-1")'


def parse_shift(shift: Any, view: NestedKey | None = None) -> tuple[tuple[int, ...], bool]:
    """The offsets a shift names, and whether they stack along a new dim (a list or a range).

    Raises:
        TypeError: when `shift` is none of the accepted forms.
        ValueError: when a range string is malformed or empty.
    """
    where = f"view_requirements[{view!r}]: " if view is not None else ""
    if keys.is_int(shift):
        return (int(shift),), False
    if isinstance(shift, str):
        first, separator, last = shift.partition(":")
        try:
            start, stop = int(first), int(last)
        except ValueError:
            start, stop = 1, 0
        if not separator or start > stop:
            raise ValueError(
                f"{where}shift={shift!r} is not a range: a range string reads "
                '"start:stop" with two ints, start <= stop, both included; e.g. "-50:-1" '
                "gives the last 50 values."
            )
        return tuple(range(start, stop + 1)), True
    if isinstance(shift, Sequence) and shift and all(keys.is_int(offset) for offset in shift):
        return tuple(int(offset) for offset in shift), True
    raise TypeError(f"{where}shift must be {_SHIFT_FORMS}; got {shift!r} ({type(shift).__name__}).")


@dataclass(frozen=True)
class ViewRequirement:
    """A column a policy reads at every step, shifted in time from another (RLlib's).

    Args:
        data_col: the entry the view reads: a key of the batch (`"observation"`, `"action"`,
            `("next", "reward")`; a name found only under `"next"`, such as `"reward"`, means
            that one) or RLlib's column names (`"obs"`, `"actions"`, `"rewards"`, `"dones"`).
            None: the view's own name.
        shift: an int, a list of ints, or an inclusive range string (`"-50:-1"`: 50 values).
            At step t the view holds `data_col` at step t + shift, within the episode.
        space: the per-frame spec (or Gymnasium space) of the data; its zero fills the steps
            before an episode's start (zeros without it). Needed for a column the policy
            itself writes besides its action (e.g. a recurrent state), whose shape the
            collector cannot know before calling the policy.
        used_for_training: False leaves the column out of the batches (the policy still
            reads it while it acts).
        used_for_compute_actions: False makes a training-only view: it may look into the
            future (`shift=1`, e.g. `"next_actions"`) and is added to the batch after
            collection, within the batch and the episode (zeros past either end).

    Before an episode's start, an observation view repeats the episode's first observation
    and any other view is zero (or `space`'s zero). Views continue across batches.

    Raises:
        TypeError, ValueError: on a malformed shift or flag.

    Examples:
        >>> from rlcollect import Collector, ViewRequirement
        >>> from rlcollect.testing import CountingEnv
        >>> views = {
        ...     "prev_actions": ViewRequirement("action", shift=-1),
        ...     "last_observations": ViewRequirement("observation", shift="-2:0"),
        ... }
        >>> collector = Collector(
        ...     CountingEnv(episode_length=3), None, frames_per_batch=4, view_requirements=views
        ... )
        >>> batch = collector.next()
        >>> batch["observation"].squeeze(-1).tolist()
        [0.0, 1.0, 2.0, 0.0]
        >>> batch["last_observations"].squeeze(-1).tolist()
        [[0.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 2.0], [0.0, 0.0, 0.0]]
        >>> bool((batch["prev_actions"][1:3] == batch["action"][0:2]).all())
        True
    """

    data_col: NestedKey | None = None
    shift: Shift = 0
    space: Any = None
    used_for_training: bool = True
    used_for_compute_actions: bool = True

    def __post_init__(self) -> None:
        parse_shift(self.shift)
        if isinstance(self.shift, list):  # frozen and comparable: keep lists as tuples
            object.__setattr__(self, "shift", tuple(self.shift))
        for name in ("used_for_training", "used_for_compute_actions"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False; got {getattr(self, name)!r}.")

    @property
    def offsets(self) -> tuple[int, ...]:
        """The time offsets the view reads, in order."""
        return parse_shift(self.shift)[0]


@dataclass(frozen=True)
class ViewColumn:
    """One view as the collector writes it at every step.

    The view is read from a window of the last `span` values of `source` per sub-env, ending at
    offset `newest` (0 for what the env writes at the root, -1 for the policy's outputs and
    `"next"` entries). When the view is that whole window (`"-3:-1"`, `-1`, ...), the window is
    the view's own column; otherwise it is a private column the view picks from.
    """

    name: NestedKey
    source: tuple[str, ...]
    offsets: tuple[int, ...]
    stacked: bool
    newest: int
    repeats_first: bool
    pad: torch.Tensor  # `[*feature]` or `[*env_batch, *feature]`, the source's dtype
    feature_shape: torch.Size
    picks: tuple[int, ...] = field(init=False)
    span: int = field(init=False)

    def __post_init__(self) -> None:
        span = self.newest - min(self.offsets) + 1
        first = self.newest - span + 1
        object.__setattr__(self, "span", span)
        object.__setattr__(self, "picks", tuple(offset - first for offset in self.offsets))

    @property
    def is_window(self) -> bool:
        """Whether the view is its whole window (no private column, no pick per step)."""
        if self.stacked:
            return self.picks == tuple(range(self.span))
        return self.span == 1

    @property
    def window_key(self) -> NestedKey:
        name = self.name if isinstance(self.name, tuple) else (self.name,)
        return self.name if self.is_window else (WINDOW_GROUP, *name)

"""RLlib's horizon options: `soft_horizon` and `no_done_at_end`.

* `max_frames_per_traj` is RLlib's `horizon`: at the limit the step is truncated and done, and
  the env resets (`StepLimit`).
* `soft_horizon=True`: at the horizon the trajectory is cut (a new trajectory id, `truncated`
  set so that value estimates bootstrap) but the env is not reset and `done` stays False; a
  recurrent policy's state goes on.
* `no_done_at_end=True`: `done` (and `terminated`) are never set, neither at an episode's end nor
  at the horizon; the env still resets when an episode ends, and the end is marked by
  `truncated` and a new trajectory id.

With either, `done == terminated | truncated` does not hold where `truncated` marks such a cut:
that is the point of both options (GAE and n-step returns run across the cut).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Horizon:
    """The horizon options, checked together."""

    soft: bool = False
    no_done_at_end: bool = False

    @classmethod
    def validate(
        cls, *, soft_horizon: bool, no_done_at_end: bool, max_frames_per_traj: int | None, env: Any
    ) -> Horizon:
        """Raises a TypeError or ValueError naming the option, its value and what would do."""
        for name, value in (("soft_horizon", soft_horizon), ("no_done_at_end", no_done_at_end)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False; got {value!r}.")
        if soft_horizon and max_frames_per_traj is None:
            raise ValueError(
                "soft_horizon=True cuts trajectories at the horizon, which is "
                "max_frames_per_traj; set max_frames_per_traj (RLlib's horizon) too."
            )
        if soft_horizon or no_done_at_end:
            nested = [key for key in env.done_keys if not isinstance(key, str)]
            if nested:
                option = "soft_horizon" if soft_horizon else "no_done_at_end"
                raise ValueError(
                    f"{option}=True rewrites the root done flags; the env has flags in groups "
                    f"{nested}, which it does not support."
                )
        return cls(soft_horizon, no_done_at_end)

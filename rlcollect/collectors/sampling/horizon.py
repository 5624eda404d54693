"""RLlib's sampling counts and horizons: `count_steps_by`, `soft_horizon`, `no_done_at_end`.

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


COUNT_STEPS_BY = ("env_steps", "agent_steps")


def frames_per_env_step(env: Any, count_steps_by: str) -> int:
    """How many frames one step of one sub-env counts for: 1 (env steps), or the number of
    agents acting at each step (agent steps; 1 for a single-agent env, as in RLlib)."""
    if count_steps_by not in COUNT_STEPS_BY:
        raise ValueError(f"count_steps_by must be one of {COUNT_STEPS_BY}; got {count_steps_by!r}.")
    if count_steps_by == "env_steps":
        return 1
    return int(getattr(env, "agents_per_step", 1))

"""`StepRecord`: what a Gymnasium env returns besides tensors (its info dicts) and when each step
ran, kept per carrier slot when a collector asks for it.

The carrier holds tensors only; Gymnasium's infos are dicts of anything. An env built with
`record_steps=True` keeps, for every slot `t` of the carrier it is bound to, the infos of the
observation at the root of `t` (from a reset, or carried over) and the infos its step at `t`
returned, one dict per sub-env, with the time each step ended. RLlib's door reads them to fill
its episodes' infos and timings; any other user can read them beside a batch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

# What the env was doing when it raised (`StepRecord.phase`): a step, or a reset.
STEP = "step"
RESET = "reset"


def infos_per_env(info: Any, num_envs: int) -> list[dict]:
    """Gymnasium's vector infos as one dict per sub-env.

    A vector env gives a dict of arrays with `"_key"` masks (a list of dicts when wrapped in
    Gymnasium's `DictInfoToList`, as RLlib wraps it); a single env gives one dict.
    """
    if isinstance(info, list):
        return info
    if num_envs == 1 and not _is_vector_info(info):
        return [dict(info)]
    per_env: list[dict] = [{} for _ in range(num_envs)]
    for key, value in info.items():
        if key.startswith("_"):
            continue
        present = info.get(f"_{key}")
        for index in range(num_envs):
            if present is None or present[index]:
                per_env[index][key] = (
                    value[index] if isinstance(value, Sequence | np.ndarray) else value
                )
    return per_env


def _is_vector_info(info: dict) -> bool:
    return any(key.startswith("_") and key[1:] in info for key in info)


class StepRecord:
    """Per carrier slot: the root infos, the step infos and the step's end time.

    Attributes:
        root_infos: `root_infos[t][i]`: sub-env `i`'s infos for the observation at root `t`:
            the reset's, where a reset wrote that observation, else the previous step's (slot 0
            takes the last slot's, as the carrier carries the last observation over).
        next_infos: `next_infos[t][i]`: the infos sub-env `i`'s step at `t` returned.
        stepped_at: `stepped_at[t]`: `time.perf_counter()` when the step at `t` returned.
        last_step: the last slot whose step completed (-1 before the first).
        step_seconds, steps: the time spent in the env's step and the number of steps, summed
            until `take_step_time()` reads and clears them.
        phase, masked: what the env is doing (`STEP`, `RESET`; None between calls), and
            whether a reset is of some sub-envs only: after the env raised, what it was doing.
    """

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs
        self.phase: str | None = None
        self.masked = False
        self._reset_at_zero = np.zeros(num_envs, dtype=np.bool_)
        self.root_infos: list[list[dict]] = []
        self.next_infos: list[list[dict]] = []
        self.stepped_at = np.zeros(0)
        self.bind(1)
        self.step_seconds = 0.0
        self.steps = 0

    def bind(self, slots: int) -> None:
        """Size the record for a carrier of `slots` slots (a batch of `slots - 1` steps and
        the slot it carries over); the last slot's root infos stay the last slot's."""
        if slots == len(self.root_infos):
            return
        last = self.root_infos[-1] if self.root_infos else [{} for _ in range(self.num_envs)]
        self.root_infos = [[{}] * self.num_envs for _ in range(slots)]
        self.next_infos = [[{}] * self.num_envs for _ in range(slots)]
        self.root_infos[-1] = list(last)
        self.stepped_at = np.zeros(slots)
        self.last_step = -1

    def begin(self, phase: str, masked: bool = False) -> None:
        """The env starts a step or a reset (of some sub-envs only, when `masked`)."""
        self.phase, self.masked = phase, masked

    def record_reset(self, t: int, info: Any, selected: np.ndarray | None = None) -> None:
        """The infos of a reset that wrote root `t` (of the `selected` sub-envs only)."""
        self.phase = None
        infos = infos_per_env(info, self.num_envs)
        if t == 0:
            self._reset_at_zero |= True if selected is None else selected
        if selected is None:
            self.root_infos[t] = list(infos)
            return
        row = self.root_infos[t]
        for index in np.flatnonzero(selected):
            row[index] = infos[index]

    def record_step(self, t: int, info: Any, started: float) -> None:
        """The infos of the step at `t`, which started at `started` (perf_counter); they are
        the root infos of `t + 1` until a reset there writes its own."""
        ended = time.perf_counter()
        self.phase = None
        if t == 0:
            self._carry_over()
        infos = infos_per_env(info, self.num_envs)
        self.next_infos[t] = infos
        if t + 1 < len(self.root_infos):
            self.root_infos[t + 1] = list(infos)
        self.stepped_at[t] = ended
        self.step_seconds += ended - started
        self.steps += 1
        self.last_step = t

    def _carry_over(self) -> None:
        """Root infos of slot 0 = the last slot's, for the sub-envs no reset wrote there."""
        carried = ~self._reset_at_zero
        if carried.any():
            row, last = self.root_infos[0], self.root_infos[-1]
            if carried.all():
                self.root_infos[0] = list(last)
            else:
                for index in np.flatnonzero(carried):
                    row[index] = last[index]
        self._reset_at_zero[:] = False

    def take_step_time(self) -> tuple[float, int]:
        """`(seconds in the env's step, steps)` since the last call."""
        taken = (self.step_seconds, self.steps)
        self.step_seconds, self.steps = 0.0, 0
        return taken

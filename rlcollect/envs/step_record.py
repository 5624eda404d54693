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


def observations_per_env(observation: Any, num_envs: int) -> list[Any]:
    """A vector env's batched observation as one observation per sub-env (views of its arrays;
    a vector env hands out fresh arrays each call)."""
    if isinstance(observation, dict):
        parts = {key: observations_per_env(value, num_envs) for key, value in observation.items()}
        return [{key: part[index] for key, part in parts.items()} for index in range(num_envs)]
    if isinstance(observation, tuple):
        parts = [observations_per_env(value, num_envs) for value in observation]
        return [tuple(part[index] for part in parts) for index in range(num_envs)]
    return list(observation)


class StepRecord:
    """Per carrier slot: the root infos, the step infos, the step's end time (and, when
    `keep_observations` is set, the raw observations as well).

    Attributes:
        root_infos: `root_infos[t][i]`: sub-env `i`'s infos for the observation at root `t`:
            the reset's, where a reset wrote that observation, else the previous step's (slot 0
            takes the last slot's, as the carrier carries the last observation over; read it
            with `root_infos_at`, which does that first when no step did it yet).
        next_infos: `next_infos[t][i]`: the infos sub-env `i`'s step at `t` returned.
        root_observations, next_observations: likewise, the env's own observations (in its
            own structure: a dict space's dicts), kept when `keep_observations` is True.
        stepped_at: `stepped_at[t]`: `time.perf_counter()` when the step at `t` returned.
        last_step: the last slot whose step completed (-1 before the first).
        step_seconds, steps: the time spent in the env's step and the number of steps, summed
            until `take_step_time()` reads and clears them.
        phase, masked: what the env is doing (`STEP`, `RESET`; None between calls), and
            whether a reset is of some sub-envs only: after the env raised, what it was doing.
    """

    def __init__(self, num_envs: int, keep_observations: bool = False) -> None:
        self.num_envs = num_envs
        self.keep_observations = keep_observations
        self.phase: str | None = None
        self.masked = False
        self._reset_at_zero = np.zeros(num_envs, dtype=np.bool_)
        self._zero_carried = True
        # Per slot, per sub-env: root and next values of each kept column.
        self._root: dict[str, list[list[Any]]] = {"infos": [], "observations": []}
        self._next: dict[str, list[list[Any]]] = {"infos": [], "observations": []}
        self.stepped_at = np.zeros(0)
        self.bind(1)
        self.step_seconds = 0.0
        self.steps = 0

    @property
    def root_infos(self) -> list[list[dict]]:
        return self._root["infos"]

    @property
    def next_infos(self) -> list[list[dict]]:
        return self._next["infos"]

    @property
    def root_observations(self) -> list[list[Any]]:
        return self._root["observations"]

    @property
    def next_observations(self) -> list[list[Any]]:
        return self._next["observations"]

    def bind(self, slots: int) -> None:
        """Size the record for a carrier of `slots` slots (a batch of `slots - 1` steps and
        the slot it carries over); the last slot's root values stay the last slot's."""
        if slots == len(self.root_infos):
            return
        for name in self._root:
            column = self._root[name]
            fill = dict if name == "infos" else type(None)
            last = column[-1] if column else [fill() for _ in range(self.num_envs)]
            self._root[name] = [[fill() for _ in range(self.num_envs)] for _ in range(slots)]
            self._next[name] = [[fill() for _ in range(self.num_envs)] for _ in range(slots)]
            self._root[name][-1] = list(last)
        self.stepped_at = np.zeros(slots)
        self.last_step = -1
        self._zero_carried = False

    def begin(self, phase: str, masked: bool = False) -> float:
        """The env starts a step or a reset (of some sub-envs only, when `masked`); returns
        the time it starts (perf_counter)."""
        self.phase, self.masked = phase, masked
        return time.perf_counter()

    def record_reset(
        self, t: int, info: Any, selected: np.ndarray | None = None, observation: Any = None
    ) -> None:
        """A reset that wrote root `t` (of the `selected` sub-envs only): its infos, and its
        observations when kept."""
        self.phase = None
        values = {"infos": infos_per_env(info, self.num_envs)}
        if self.keep_observations:
            values["observations"] = observations_per_env(observation, self.num_envs)
        if t == 0:
            self._reset_at_zero |= True if selected is None else selected
        if t == len(self.root_infos) - 1:
            self._zero_carried = False
        for name, per_env in values.items():
            if selected is None:
                self._root[name][t] = list(per_env)
                continue
            row = self._root[name][t]
            for index in np.flatnonzero(selected):
                row[index] = per_env[index]

    def record_step(self, t: int, info: Any, started: float, observation: Any = None) -> None:
        """The step at `t`, which started at `started` (perf_counter): its infos (and its
        observations, when kept), the root values of `t + 1` until a reset there writes its own."""
        ended = time.perf_counter()
        self.phase = None
        if t == 0:
            self._carry_over()
        values = {"infos": infos_per_env(info, self.num_envs)}
        if self.keep_observations:
            values["observations"] = observations_per_env(observation, self.num_envs)
        slots = len(self.root_infos)
        for name, per_env in values.items():
            self._next[name][t] = per_env
            if t + 1 < slots:
                self._root[name][t + 1] = list(per_env)
        if t + 2 == slots:  # the last slot changed: slot 0 takes it at the next carry-over
            self._zero_carried = False
        self.stepped_at[t] = ended
        self.step_seconds += ended - started
        self.steps += 1
        self.last_step = t

    def root_infos_at(self, t: int) -> list[dict]:
        """`root_infos[t]`, slot 0 carried over first when no step did it yet."""
        return self._root_at("infos", t)

    def root_observations_at(self, t: int) -> list[Any]:
        """`root_observations[t]`, slot 0 carried over first when no step did it yet."""
        return self._root_at("observations", t)

    def _root_at(self, name: str, t: int) -> list[Any]:
        if t == 0:
            self._carry_over()
        return self._root[name][t]

    def _carry_over(self) -> None:
        """Root values of slot 0 = the last slot's, for the sub-envs no reset wrote there
        (once per batch)."""
        if self._zero_carried:
            return
        carried = ~self._reset_at_zero
        if carried.any():
            for column in self._root.values():
                row, last = column[0], column[-1]
                for index in np.flatnonzero(carried):
                    row[index] = last[index]
        self._reset_at_zero[:] = False
        self._zero_carried = True

    def take_step_time(self) -> tuple[float, int]:
        """`(seconds in the env's step, steps)` since the last call."""
        taken = (self.step_seconds, self.steps)
        self.step_seconds, self.steps = 0.0, 0
        return taken

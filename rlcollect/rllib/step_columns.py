"""Preallocated `[T, num_envs, ...]` NumPy columns the fast path writes each step into."""

from __future__ import annotations

from typing import Any

import numpy as np


class StepColumns:
    """Named NumPy columns of `capacity` rows, allocated from the first value written to each
    (its dtype and shape), grown by doubling when a sample runs longer (episode mode).

    The arrays live across `sample()` calls: a chunk copies what it reads, so rewriting them in
    the next call changes no episode already handed out.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = max(1, capacity)
        self._arrays: dict[str, np.ndarray] = {}
        self.infos: list[list[dict]] = [[] for _ in range(self._capacity)]

    def reserve(self, rows: int) -> None:
        """Room for at least `rows` rows in every column (existing rows kept)."""
        if rows <= self._capacity:
            return
        capacity = max(rows, 2 * self._capacity)
        for name, array in self._arrays.items():
            grown = np.empty((capacity, *array.shape[1:]), dtype=array.dtype)
            grown[: self._capacity] = array
            self._arrays[name] = grown
        self.infos.extend([] for _ in range(capacity - self._capacity))
        self._capacity = capacity

    def write(self, name: str, row: int, value: Any) -> None:
        """`column[row] = value` (the column allocated on its first write)."""
        array = self._arrays.get(name)
        if array is None:
            value = np.asarray(value)
            array = np.empty((self._capacity, *value.shape), dtype=value.dtype)
            self._arrays[name] = array
        array[row] = value

    def row(self, name: str, row: int) -> np.ndarray:
        """A view of one row (e.g. the observations the module reads, without a copy)."""
        return self._arrays[name][row]

    def read(self, name: str, rows: slice, env_index: int) -> np.ndarray:
        """A copy of one sub-env's `rows` of a column."""
        return self._arrays[name][rows, env_index].copy()

    def names(self) -> list[str]:
        """The columns written so far."""
        return list(self._arrays)

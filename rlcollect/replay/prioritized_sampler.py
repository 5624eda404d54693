"""PrioritizedSampler: prioritized experience replay over a vectorised sum tree."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlcollect.errors import MisuseError
from rlcollect.keys import PRIORITY_WEIGHT
from rlcollect.replay.samplers import Sampler
from rlcollect.replay.storage import Storage
from rlcollect.replay.sum_tree import SumTree


def _check_exponent(name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}.")
    return float(value)


def _flat_array(values: Any, dtype: type) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().reshape(-1).cpu().numpy()
    return np.asarray(values, dtype=dtype).reshape(-1)


class PrioritizedSampler(Sampler):
    """Draws item ``i`` with probability ``P(i) = w_i / sum_j w_j``, ``w_i = (p_i + eps) ** alpha``.

    Prioritized experience replay (Schaul et al., 2015). Each draw comes with its importance
    weight ``(N * P(i)) ** -beta`` divided by the largest such weight, i.e.
    ``(w_i / min_j w_j) ** -beta``, in the info and the sample under ``"priority_weight"``.
    Items written since the last call get the largest priority seen so far (1.0 at first), so
    every new item is likely to be replayed soon; this also covers items written by other
    processes to a shared storage. Priorities live in a :class:`~rlcollect.replay.sum_tree.SumTree`
    updated and searched in batches.

    Args:
        max_capacity: the number of slots it tracks; at least the storage's ``max_size``.
        alpha: how strongly priorities skew the draws (0: uniform).
        beta: how strongly the importance weights correct for the skew (1: fully).
        eps: added to every priority, so that a priority of 0 can still be drawn.

    Examples:
        >>> import torch
        >>> from rlcollect.replay import LazyTensorStorage, PrioritizedSampler, ReplayBuffer
        >>> rb = ReplayBuffer(
        ...     storage=LazyTensorStorage(10), sampler=PrioritizedSampler(10, alpha=1.0, beta=1.0)
        ... )
        >>> _ = rb.extend(torch.arange(2))
        >>> rb.update_priority(torch.tensor([0, 1]), torch.tensor([0.0, 1000.0]))
        >>> rb.sample(5).tolist()
        [1, 1, 1, 1, 1]
    """

    def __init__(self, max_capacity: int, alpha: float, beta: float, eps: float = 1e-8) -> None:
        if isinstance(max_capacity, bool) or not isinstance(max_capacity, int) or max_capacity <= 0:
            raise ValueError(
                f"max_capacity must be a positive int (at least the storage's max_size), got "
                f"{max_capacity!r}."
            )
        self.max_capacity = max_capacity
        self.alpha = _check_exponent("alpha", alpha)
        self.beta = _check_exponent("beta", beta)
        self.eps = _check_exponent("eps", eps)
        self._tree = SumTree(max_capacity)
        self._max_priority = 1.0
        self._seen_write_count: int | None = None
        self._seen_length = 0

    @property
    def max_priority(self) -> float:
        """The priority given to new items: the largest priority set so far, 1.0 at first."""
        return self._max_priority

    def weight_of(self, priority: np.ndarray | float) -> np.ndarray:
        """The sum-tree weight ``(priority + eps) ** alpha`` of raw priorities."""
        return np.power(np.asarray(priority, dtype=np.float64) + self.eps, self.alpha)

    def _catch_up(self, storage: Storage) -> None:
        """Gives the largest priority to the items written since the last call, and weight 0 to
        slots that left the valid window without being rewritten (a repaired crashed write)."""
        capacity = storage.max_size
        if capacity > self.max_capacity:
            raise ValueError(
                f"the storage holds max_size={capacity} items but the PrioritizedSampler "
                f"tracks max_capacity={self.max_capacity}; build it with max_capacity >= "
                f"{capacity}."
            )
        cursor, length, write_count = storage.log.snapshot()
        seen, seen_length = self._seen_write_count, self._seen_length
        if seen is None or write_count < seen:
            self._tree.clear()
            new, expected_length = length, length
        else:
            new = min(write_count - seen, length)
            expected_length = min(seen_length + write_count - seen, capacity)
        self._seen_write_count, self._seen_length = write_count, length
        new_weight = float(self.weight_of(self._max_priority))
        self._fill(capacity, (cursor - new) % capacity, new, new_weight)
        if length < expected_length:
            self._fill(capacity, cursor, capacity - length, 0.0)

    def _fill(self, capacity: int, start: int, count: int, value: float) -> None:
        head = min(count, capacity - start)
        if head:
            self._tree.update_range(start, np.full(head, value))
        if head < count:
            self._tree.update_range(0, np.full(count - head, value))

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[Any, Any]]:
        self._catch_up(storage)
        total = self._tree.total
        if not total > 0:
            raise MisuseError(
                "every stored item has weight 0 ((priority + eps) ** alpha), so none can be "
                "drawn; use eps > 0 or give some items a positive priority."
            )
        targets = torch.rand(batch_size, dtype=torch.float64, generator=self.generator).numpy()
        slots = self._tree.find(targets * total)
        ratio = self._tree.leaves[slots] / self._tree.min_positive()
        weights = np.power(ratio, -self.beta).astype(np.float32)
        return torch.from_numpy(slots), {PRIORITY_WEIGHT: torch.from_numpy(weights)}

    def update_priority(self, storage: Storage, index: Any, priority: Any) -> None:
        """Sets the priorities of the items at slots ``index``.

        Args:
            storage: the storage the slots belong to.
            index: slots, as returned in the sample info (``"index"``); an int or a 1-D tensor.
            priority: one priority for all slots, or one per slot; finite and >= 0.

        Raises:
            ValueError: a priority is negative or not finite, the shapes do not match, or a slot
                holds no item. Nothing is changed then.
        """
        self._catch_up(storage)
        slots = _flat_array(index, np.int64)
        values = _flat_array(priority, np.float64)
        if values.size == 1:
            values = np.broadcast_to(values, slots.shape)
        elif values.shape != slots.shape:
            raise ValueError(
                f"got {values.size} priorities for {slots.size} indices; pass one priority per "
                "index, or a single priority for all of them."
            )
        self._check_priorities(values)
        self._check_slots(storage, slots)
        if values.size:
            self._max_priority = max(self._max_priority, float(values.max()))
        self._tree.update(slots, self.weight_of(values))

    @staticmethod
    def _check_priorities(values: np.ndarray) -> None:
        if not values.size or (values.min() >= 0 and np.isfinite(values.max())):
            return  # two reductions; NaN fails the first comparison
        bad = ~np.isfinite(values) | (values < 0)
        if bad.any():
            raise ValueError(
                f"priorities must be finite and >= 0, got {values[bad][:5].tolist()} at "
                f"positions {np.flatnonzero(bad)[:5].tolist()}; pass e.g. td_error.abs() and "
                "replace NaNs before updating."
            )

    @staticmethod
    def _check_slots(storage: Storage, slots: np.ndarray) -> None:
        cursor, length, _ = storage.log.snapshot()
        capacity = storage.max_size
        outside = (slots < 0) | (slots >= capacity)
        outside |= (slots - (cursor - length)) % capacity >= length
        if outside.any():
            raise ValueError(
                f"indices {slots[outside][:5].tolist()} hold no stored item (the buffer holds "
                f"{length} items in {capacity} slots); pass the indices returned by sample()."
            )

    def empty(self) -> None:
        self._tree.clear()
        self._max_priority = 1.0
        self._seen_write_count = None
        self._seen_length = 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "max_capacity": self.max_capacity,
            "alpha": self.alpha,
            "beta": self.beta,
            "eps": self.eps,
            "max_priority": self._max_priority,
            "seen_write_count": self._seen_write_count,
            "seen_length": self._seen_length,
            "weights": torch.from_numpy(self._tree.leaves.copy()),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict["max_capacity"] != self.max_capacity:
            raise ValueError(
                f"the saved sampler tracks max_capacity={state_dict['max_capacity']}, this one "
                f"{self.max_capacity}; load it into a PrioritizedSampler of the same capacity."
            )
        self.alpha, self.beta, self.eps = state_dict["alpha"], state_dict["beta"], state_dict["eps"]
        self._max_priority = state_dict["max_priority"]
        self._seen_write_count = state_dict["seen_write_count"]
        self._seen_length = state_dict["seen_length"]
        self._tree.clear()
        self._tree.update_range(0, np.asarray(state_dict["weights"], dtype=np.float64))

    def dumps(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = self.state_dict()
        np.save(path / "weights.npy", state.pop("weights").numpy())
        (path / "sampler.json").write_text(json.dumps(state))

    def loads(self, path: str | Path) -> None:
        path = Path(path)
        state = json.loads((path / "sampler.json").read_text())
        state["weights"] = np.load(path / "weights.npy")
        self.load_state_dict(state)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_capacity={self.max_capacity}, alpha={self.alpha}, "
            f"beta={self.beta}, eps={self.eps})"
        )

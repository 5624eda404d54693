"""A vectorised sum tree: batched weight updates and prefix-sum searches with NumPy."""

from __future__ import annotations

import numpy as np
import torch

# The longest flat top row. A search takes one cumulative sum over the top row (torch's
# vectorised cumsum: ~8 us for 8192 nodes) and then one binary step per level below it; an
# update takes one step per level. Each step costs several NumPy calls on random nodes, so a
# top row of 8192 leaves 4 levels for 10^5 slots, 7 for 10^6, and none up to 8192 slots.
MAX_TOP_ROW = 8192


class SumTree:
    """Non-negative weights over ``capacity`` slots, updated and searched in batches.

    The slots are the leaves of a complete binary tree stored in one array (node ``i`` has the
    children ``2i`` and ``2i + 1``) whose nodes hold the sums of their children, up to a *top
    row* of nodes. Above it nothing is stored: a search takes one cumulative sum of the top row,
    finds each target's top node with ``searchsorted``, and descends the few levels below it for
    every target at once. Every step is one NumPy call over the whole batch, never a Python loop
    over items.

    A second array of the same shape holds the minimum positive weight of each subtree (``inf``
    where none is positive), for importance-sampling weights.

    Args:
        capacity: the number of slots.

    Examples:
        >>> import numpy as np
        >>> tree = SumTree(5)
        >>> tree.update(np.array([0, 2, 4]), np.array([1.0, 2.0, 1.0]))
        >>> tree.total
        4.0
        >>> tree.find(np.array([0.5, 1.0, 2.9, 3.5])).tolist()
        [0, 2, 2, 4]
        >>> tree.min_positive()
        1.0
    """

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"a SumTree needs a positive capacity, got {capacity}.")
        self.capacity = int(capacity)
        self.depth = max(0, (self.capacity - 1).bit_length())
        self.size = 1 << self.depth
        self.levels = max(0, self.depth - MAX_TOP_ROW.bit_length() + 1)
        self.top = self.size >> self.levels
        self.nodes = np.zeros(2 * self.size, dtype=np.float64)
        self.minima = np.full(2 * self.size, np.inf)
        self._top_row = torch.from_numpy(self.nodes[self.top : 2 * self.top])

    @property
    def leaves(self) -> np.ndarray:
        """The weights of the slots (a view)."""
        return self.nodes[self.size : self.size + self.capacity]

    @property
    def total(self) -> float:
        """The sum of all weights."""
        return float(self.nodes[self.top : 2 * self.top].sum())

    def update(self, index: np.ndarray, values: np.ndarray) -> None:
        """Sets the weights of the slots ``index`` (duplicates: the last value wins)."""
        nodes, minima = self.nodes, self.minima
        position = index + self.size
        nodes[position] = values
        minima[position] = np.where(values > 0, values, np.inf)
        for _ in range(self.levels):
            position = position >> 1
            left = position << 1
            right = left | 1
            nodes[position] = nodes[left] + nodes[right]
            minima[position] = np.minimum(minima[left], minima[right])

    def update_range(self, start: int, values: np.ndarray) -> None:
        """Sets the weights of the consecutive slots ``start .. start + len(values) - 1``."""
        nodes, minima = self.nodes, self.minima
        low = start + self.size
        high = low + len(values)
        nodes[low:high] = values
        minima[low:high] = np.where(values > 0, values, np.inf)
        for _ in range(self.levels):
            low, high = low >> 1, ((high - 1) >> 1) + 1
            left, right = slice(2 * low, 2 * high, 2), slice(2 * low + 1, 2 * high, 2)
            np.add(nodes[left], nodes[right], out=nodes[low:high])
            np.minimum(minima[left], minima[right], out=minima[low:high])

    def find(self, targets: np.ndarray) -> np.ndarray:
        """For each target in ``[0, total)``, the slot whose cumulative weight range holds it.

        Slots of weight 0 are never returned (targets are clipped into the valid range).
        """
        cumulative = torch.cumsum(self._top_row, 0).numpy()
        targets = np.minimum(targets, np.nextafter(cumulative[-1], 0.0))
        top = np.searchsorted(cumulative, targets, side="right")
        remaining = targets - np.where(top > 0, cumulative[top - 1], 0.0)
        position = top + self.top
        nodes = self.nodes
        for _ in range(self.levels):
            left = position << 1
            left_sum = nodes[left]
            go_right = remaining >= left_sum
            remaining = np.where(go_right, remaining - left_sum, remaining)
            position = left + go_right
        slots = position - self.size
        return self._step_off_empty(slots)

    def _step_off_empty(self, slots: np.ndarray) -> np.ndarray:
        # Rounding can land a target on a zero-weight slot next to a boundary: move such a pick
        # to the nearest positive slot before it, or failing that after it.
        leaves = self.leaves
        empty = (slots >= self.capacity) | (leaves[np.minimum(slots, self.capacity - 1)] <= 0)
        if not empty.any():
            return slots
        positive = np.flatnonzero(leaves > 0)
        before = np.searchsorted(positive, slots[empty], side="right") - 1
        slots[empty] = positive[np.maximum(before, 0)]
        return slots

    def min_positive(self) -> float:
        """The smallest positive weight (``inf`` when none is positive)."""
        return float(self.minima[self.top : 2 * self.top].min())

    def clear(self) -> None:
        """Sets every weight to 0."""
        self.nodes[:] = 0.0
        self.minima[:] = np.inf

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_top_row"]  # a view of ``nodes``: rebuilt, not copied
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._top_row = torch.from_numpy(self.nodes[self.top : 2 * self.top])

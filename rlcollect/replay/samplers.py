"""Samplers choose the items of a batch: the contract, RandomSampler, SamplerWithoutReplacement."""

from __future__ import annotations

import abc
import warnings
from pathlib import Path
from typing import Any

import torch

from rlcollect.replay.storage import Storage


def window_slots(storage: Storage, positions: torch.Tensor) -> torch.Tensor:
    """Maps positions in the valid window (0 = oldest item) to storage slots."""
    start = storage.log.window_start(storage.max_size)
    if start == 0:
        return positions
    return (positions + start).remainder_(storage.max_size)


class Sampler(abc.ABC):
    """Chooses which stored items make up a batch.

    Contract: :meth:`sample` runs while the caller holds ``storage.lock`` and ``len(storage) > 0``.
    It returns the slots of the batch (a 1-D long tensor, every slot inside the storage's valid
    window) and an ``info`` dict of per-item tensors, which the replay buffer also writes into
    TensorDict samples under their keys (e.g. ``"priority_weight"``). :meth:`sample` raises on a
    request it cannot serve and then leaves the sampler unchanged. ``ran_out`` turns True on the
    last batch of an epoch, for samplers that have epochs.

    Examples:
        >>> from rlcollect.replay import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(8), sampler=RandomSampler())
        >>> _ = rb.extend(torch.arange(5))
        >>> with rb.storage.lock:
        ...     slots, info = rb.sampler.sample(rb.storage, batch_size=3)
        >>> slots.shape, bool((slots < 5).all()), info
        (torch.Size([3]), True, {})
    """

    generator: torch.Generator | None = None
    ran_out: bool = False

    @abc.abstractmethod
    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[Any, Any]]:
        """The slots of a batch of ``batch_size`` items, and per-item info."""

    def check_batch_size(self, batch_size: int) -> None:
        """Raises a ValueError if this sampler can never serve batches of ``batch_size``."""
        return None

    def update_priority(self, storage: Storage, index: Any, priority: Any) -> None:
        """Changes the priorities of items (only prioritized samplers have any)."""
        warnings.warn(
            f"update_priority() has no effect with a {type(self).__name__}; use a "
            "PrioritizedSampler for prioritized replay.",
            stacklevel=3,
        )

    def empty(self) -> None:
        """Forgets everything learnt about the stored items."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """The sampler's state, as a picklable dict."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned."""
        return None

    def dumps(self, path: str | Path) -> None:
        """Saves the sampler's state into the directory ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), path / "sampler.pt")

    def loads(self, path: str | Path) -> None:
        """Restores a state saved with :meth:`dumps`."""
        self.load_state_dict(torch.load(Path(path) / "sampler.pt", weights_only=False))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class RandomSampler(Sampler):
    """Draws items uniformly at random, with replacement.

    Examples:
        >>> import torch
        >>> from rlcollect.replay import LazyTensorStorage, RandomSampler, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=RandomSampler())
        >>> _ = rb.extend(torch.arange(5))
        >>> set(rb.sample(100).tolist()) <= set(range(5))
        True
    """

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[Any, Any]]:
        length = len(storage)
        positions = torch.randint(length, (batch_size,), generator=self.generator)
        if length == storage.max_size:
            return positions, {}  # every slot is valid: uniform positions are uniform slots
        return window_slots(storage, positions), {}


class SamplerWithoutReplacement(Sampler):
    """Draws every item once per epoch, in shuffled (or storage) order.

    When the stored items change in number, a new epoch starts. Iterating over a replay buffer
    with this sampler (``for batch in rb``) runs one epoch.

    Args:
        drop_last: skip the last batch of an epoch when it would be smaller than the batch size.
            With it, a batch size larger than the number of items raises. Defaults to False.
        shuffle: draw in random order; else from the oldest item to the newest. Defaults to True.

    Examples:
        >>> import torch
        >>> from rlcollect.replay import LazyTensorStorage, ReplayBuffer, SamplerWithoutReplacement
        >>> rb = ReplayBuffer(
        ...     storage=LazyTensorStorage(10), sampler=SamplerWithoutReplacement(), batch_size=4
        ... )
        >>> _ = rb.extend(torch.arange(10))
        >>> sorted(torch.cat(list(rb)).tolist()) == list(range(10))
        True
    """

    def __init__(self, drop_last: bool = False, shuffle: bool = True) -> None:
        self.drop_last = drop_last
        self.shuffle = shuffle
        self._order: torch.Tensor | None = None
        self._epoch_length = 0
        self.ran_out = False

    def _new_order(self, length: int) -> torch.Tensor:
        if self.shuffle:
            return torch.randperm(length, generator=self.generator)
        return torch.arange(length)

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[Any, Any]]:
        length = len(storage)
        if self.drop_last and batch_size > length:
            raise ValueError(
                f"batch_size={batch_size} is larger than the {length} stored items, so a "
                "SamplerWithoutReplacement with drop_last=True cannot draw a batch without "
                "repeating items; add items, lower the batch size, or use drop_last=False."
            )
        order = self._order
        if order is None or self._epoch_length != length:
            order = self._new_order(length)
            self._epoch_length = length
        positions, order = order[:batch_size], order[batch_size:]
        self.ran_out = order.numel() == 0 or (self.drop_last and order.numel() < batch_size)
        self._order = self._new_order(length) if self.ran_out else order
        return window_slots(storage, positions), {}

    def empty(self) -> None:
        self._order = None
        self._epoch_length = 0
        self.ran_out = False

    def state_dict(self) -> dict[str, Any]:
        return {
            "order": None if self._order is None else self._order.clone(),
            "epoch_length": self._epoch_length,
            "ran_out": self.ran_out,
            "drop_last": self.drop_last,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        order = state_dict["order"]
        self._order = None if order is None else order.clone()
        self._epoch_length = state_dict["epoch_length"]
        self.ran_out = state_dict["ran_out"]
        self.drop_last = state_dict["drop_last"]
        self.shuffle = state_dict["shuffle"]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(drop_last={self.drop_last}, shuffle={self.shuffle})"

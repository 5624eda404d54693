"""ReplayBuffer: a storage, a sampler and a writer composed behind TorchRL's replay buffer API."""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from tensordict import TensorDictBase

from rlcollect.batch.compact import is_compact, transition_view
from rlcollect.errors import MisuseError
from rlcollect.keys import INDEX
from rlcollect.replay.samplers import RandomSampler, Sampler
from rlcollect.replay.storage import ListStorage, Storage
from rlcollect.replay.writers import RoundRobinWriter, Writer


def _check_component(name: str, value: Any, kind: type, example: str) -> None:
    if not isinstance(value, kind):
        raise TypeError(
            f"{name} must be a {kind.__name__} (e.g. {example}), got {type(value).__name__}."
        )


def _check_count(name: str, value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(f"{name} must be a positive int or None, got {value!r}.")
    return value


class ReplayBuffer:
    """A replay buffer: ``extend`` it with batches, ``sample`` batches back.

    It composes a :class:`~rlcollect.replay.storage.Storage` (where items live), a
    :class:`~rlcollect.replay.samplers.Sampler` (which items a batch holds) and a
    :class:`~rlcollect.replay.writers.Writer` (which slots new items take), with TorchRL's names
    and semantics, so ``torchrl.data.ReplayBuffer`` code runs with a change of import.
    TensorDict batches of any batch shape (e.g. a collector's ``[*env_batch, T]``) are flattened
    to frames. TensorDict samples carry the slots under ``"index"`` and the sampler's per-item
    info (e.g. ``"priority_weight"``).

    Keyword Args:
        storage: defaults to ``ListStorage(1000)``.
        sampler: defaults to :class:`RandomSampler`.
        writer: defaults to :class:`RoundRobinWriter`.
        batch_size: the default size of :meth:`sample` (needed to iterate over the buffer).
        transform: called on every sample; its ``inv`` method, if any, on every added batch.
        shared: put the storage and its cursor in shared memory (or its memory-mapped files), so
            that worker processes can ``extend`` it while this process samples.
        prefetch: the number of batches sampled ahead in background threads.
        generator: the random generator of the sampler (default: torch's global one).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from rlcollect.replay import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(1000), batch_size=32)
        >>> batch = TensorDict({"observation": torch.randn(8, 25, 4)}, [8, 25])  # [envs, time]
        >>> rb.extend(batch).shape
        torch.Size([200])
        >>> sample = rb.sample()
        >>> sample["observation"].shape, sample["index"].shape
        (torch.Size([32, 4]), torch.Size([32]))
    """

    def __init__(
        self,
        *,
        storage: Storage | None = None,
        sampler: Sampler | None = None,
        writer: Writer | None = None,
        batch_size: int | None = None,
        transform: Callable[[Any], Any] | None = None,
        shared: bool = False,
        prefetch: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        self._storage = storage if storage is not None else ListStorage(1000)
        self._sampler = sampler if sampler is not None else RandomSampler()
        self._writer = writer if writer is not None else RoundRobinWriter()
        _check_component("storage", self._storage, Storage, "LazyTensorStorage(100_000)")
        _check_component("sampler", self._sampler, Sampler, "RandomSampler()")
        _check_component("writer", self._writer, Writer, "RoundRobinWriter()")
        self._batch_size = _check_count("batch_size", batch_size)
        self._prefetch = _check_count("prefetch", prefetch or None) or 0
        self._check_options(shared)
        self._transform = transform
        self._sampler.generator = generator
        self._writer.register_storage(self._storage)
        self.shared = shared
        if shared:
            self._storage.share()
        self._executor: ThreadPoolExecutor | None = None
        self._queue: collections.deque[Future] = collections.deque()

    def _check_options(self, shared: bool) -> None:
        if self._batch_size is not None:
            self._sampler.check_batch_size(self._batch_size)
        if getattr(self._sampler, "drop_last", False) and self._batch_size is None:
            raise ValueError(
                "a sampler with drop_last=True needs a fixed batch size; pass batch_size to "
                "the ReplayBuffer."
            )
        if self._prefetch and self._batch_size is None:
            raise ValueError("prefetch needs a fixed batch size; pass batch_size as well.")
        if self._prefetch and shared:
            raise ValueError("a shared buffer cannot prefetch; pass prefetch=None or shared=False.")

    # --- components ---

    @property
    def storage(self) -> Storage:
        """Where the items live."""
        return self._storage

    @property
    def sampler(self) -> Sampler:
        """What chooses the items of a batch."""
        return self._sampler

    @property
    def writer(self) -> Writer:
        """What chooses the slots of new items."""
        return self._writer

    @property
    def batch_size(self) -> int | None:
        """The default size of :meth:`sample`."""
        return self._batch_size

    def __len__(self) -> int:
        with self._storage.lock:
            return len(self._storage)

    @property
    def write_count(self) -> int:
        """The number of items ever written (over every process, for shared buffers)."""
        with self._storage.lock:
            return self._storage.log.write_count

    # --- writing ---

    def extend(self, data: Any, *, tally_slots: Sequence[int] = ()) -> torch.Tensor:
        """Adds a batch of items and returns their slots (a 1-D long tensor).

        Args:
            data: a TensorDict whose batch dims all index frames (``[N]``, ``[*B, T]``, ...), a
                compact batch (``compact_obs=True``; its transitions are stored), a tensor whose
                first dim indexes items, or (for a ListStorage) a list of items.

        Keyword Args:
            tally_slots: writer tallies (from :meth:`claim_tallies`) that count these frames in
                the write's own commit: a writer killed before the commit leaves neither the
                items nor the count, one killed after it leaves both.

        Raises:
            ValueError: the batch's keys or per-frame shapes differ from the stored ones, or it
                has no batch dimension. The buffer is left unchanged.
        """
        if is_compact(data):
            data = transition_view(data)
        data = self._inverse_transform(data)
        batch_dims = data.batch_dims if isinstance(data, TensorDictBase) else 1
        if batch_dims == 0 or (isinstance(data, torch.Tensor) and data.dim() == 0):
            raise ValueError(
                "extend() takes a batch of items but got a single one (no batch dimension); "
                "use add() for one item."
            )
        storage = self._storage
        storage.check_writable_here()
        with storage.lock:
            frames = storage.prepare(data, batch_dims)
            if frames.num_frames == 0:
                return torch.zeros(0, dtype=torch.long)
            if tally_slots:
                return self._writer.extend(frames, tally_slots)
            return self._writer.extend(frames)

    def claim_tallies(self, count: int) -> list[int]:
        """Claims `count` writer tallies of the storage for this process (see
        :meth:`extend`); release them with :meth:`release_tallies`.

        Raises:
            MisuseError: the storage has fewer free tallies.
        """
        with self._storage.lock:
            return self._storage.log.tallies.claim(count)

    def read_tallies(self, slots: Sequence[int]) -> list[int]:
        """The frames committed so far in each writer tally of `slots` (after repairing the
        write of a writer that was killed)."""
        with self._storage.lock:
            return self._storage.log.tallies.read(slots)

    def release_tallies(self, slots: Sequence[int]) -> None:
        """Frees writer tallies this process claimed."""
        with self._storage.lock:
            self._storage.log.tallies.release(slots)

    def add(self, data: Any) -> int:
        """Adds one item (a TensorDict of batch size ``[]``, a tensor, or any object for a
        ListStorage) and returns its slot."""
        if isinstance(data, (TensorDictBase, torch.Tensor)):
            return int(self.extend(data.unsqueeze(0))[0])
        return int(self.extend([data])[0])

    def _inverse_transform(self, data: Any) -> Any:
        inverse = getattr(self._transform, "inv", None)
        return inverse(data) if callable(inverse) else data

    # --- sampling ---

    def sample(self, batch_size: int | None = None, return_info: bool = False) -> Any:
        """Draws a batch.

        Args:
            batch_size: the number of items; defaults to the buffer's ``batch_size``.
            return_info: also return the info dict (``"index"``, and e.g. ``"priority_weight"``).

        Raises:
            MisuseError: the buffer is empty.
            ValueError: the sampler cannot serve this batch size. The buffer is left unchanged.
        """
        if batch_size is None:
            batch_size = self._batch_size
            if batch_size is None:
                raise ValueError(
                    "sample() needs a batch size; pass batch_size to sample() or to the buffer."
                )
        _check_count("batch_size", batch_size)
        if self._prefetch and batch_size == self._batch_size:
            data, info = self._prefetched(batch_size)
        else:
            data, info = self._sample(batch_size)
        return (data, info) if return_info else data

    def _sample(self, batch_size: int) -> tuple[Any, dict[Any, Any]]:
        storage = self._storage
        with storage.lock:
            if len(storage) == 0:
                raise MisuseError(
                    "cannot sample from an empty replay buffer; extend() it with data first."
                )
            index, info = self._sampler.sample(storage, batch_size)
            data = storage.get(index)
        info[INDEX] = index
        if isinstance(data, TensorDictBase):
            for key, value in info.items():
                data.set(key, value)
        if self._transform is not None:
            data = self._transform(data)
        return data, info

    def _prefetched(self, batch_size: int) -> tuple[Any, dict[Any, Any]]:
        if self._executor is None:
            # One thread: draws run in the order they are asked for. With several, two draws
            # could take the lock out of order, and a sampler without replacement would hand
            # an item twice across the end of an epoch.
            self._executor = ThreadPoolExecutor(max_workers=1)
        if not self._queue:
            self._queue.append(self._executor.submit(self._sample, batch_size))
        result = self._queue.popleft().result()
        while len(self._queue) < self._prefetch:
            self._queue.append(self._executor.submit(self._sample, batch_size))
        return result

    def __iter__(self) -> Iterator[Any]:
        """Samples batches of ``batch_size`` until the sampler runs out (never, for some)."""
        if self._batch_size is None:
            raise ValueError("iterating over a buffer needs a batch_size; pass it to the buffer.")
        self._sampler.ran_out = False
        while not self._sampler.ran_out:
            yield self.sample()

    def update_priority(self, index: Any, priority: Any) -> None:
        """Sets the priorities of the items at ``index`` (for a PrioritizedSampler).

        Raises:
            ValueError: a priority is negative or not finite, or an index holds no item. The
                priorities are left unchanged.
        """
        with self._storage.lock:
            self._sampler.update_priority(self._storage, index, priority)

    def __getitem__(self, index: torch.Tensor | int | slice | Sequence[int]) -> Any:
        """Items by slot, as the storage takes them: an int, a slice over the stored items, a
        list or a 1-D tensor (under the storage's lock)."""
        return self._storage[index]

    # --- housekeeping ---

    def empty(self) -> None:
        """Removes every item and resets the cursor and the write count."""
        self._drain_prefetch()
        with self._storage.lock:
            self._storage.empty()
            self._sampler.empty()

    def _drain_prefetch(self) -> None:
        while self._queue:
            self._queue.popleft().result()

    def state_dict(self) -> dict[str, Any]:
        """The items, the sampler's state (e.g. priorities) and the writer's position."""
        self._drain_prefetch()
        with self._storage.lock:
            return {
                "storage": self._storage.state_dict(),
                "sampler": self._sampler.state_dict(),
                "writer": self._writer.state_dict(),
                "batch_size": self._batch_size,
            }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned (into components of the same kinds)."""
        self._drain_prefetch()
        with self._storage.lock:
            self._storage.load_state_dict(state_dict["storage"])
            self._sampler.load_state_dict(state_dict["sampler"])
            self._writer.load_state_dict(state_dict["writer"])
            self._batch_size = state_dict["batch_size"]

    def dumps(self, path: str | Path) -> None:
        """Saves the buffer into the directory ``path`` (tensors as raw files, no pickles)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self._drain_prefetch()
        with self._storage.lock:
            self._storage.dumps(path / "storage")
            self._sampler.dumps(path / "sampler")
            self._writer.dumps(path / "writer")
            (path / "buffer.json").write_text(json.dumps({"batch_size": self._batch_size}))

    def loads(self, path: str | Path) -> None:
        """Restores a buffer saved with :meth:`dumps` (into components of the same kinds)."""
        path = Path(path)
        self._drain_prefetch()
        with self._storage.lock:
            self._storage.loads(path / "storage")
            self._sampler.loads(path / "sampler")
            self._writer.loads(path / "writer")
            self._batch_size = json.loads((path / "buffer.json").read_text())["batch_size"]

    def close(self) -> None:
        """Stops prefetching and releases the storage's files or shared memory."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self._queue.clear()
        self._storage.close()

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_executor"] = None
        state["_queue"] = collections.deque()
        return state

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(storage={self._storage!r}, sampler={self._sampler!r}, "
            f"writer={type(self._writer).__name__}(), batch_size={self._batch_size}, "
            f"shared={self.shared})"
        )

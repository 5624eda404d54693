"""`RayReplayBuffer`: a `ReplayBuffer` served by a Ray actor, used from any process of the cluster.

The actor (`ReplayBufferServer`) holds one `ReplayBuffer` with any storage, sampler and writer
of ours and answers one call at a time, so concurrent writers and samplers never interleave.
`RayReplayBufferClient` is its picklable face: it finds the actor by name, so it works in the
driver, in Ray actors (a `RayCollector`'s actors extend it directly) and in any other process,
which it connects to the cluster first if needed.
"""

from __future__ import annotations

import contextlib
import copy
import uuid
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import torch
from tensordict import TensorDictBase

from rlcollect.errors import MisuseError
from rlcollect.replay.replay_buffer import ReplayBuffer
from rlcollect.replay.samplers import Sampler
from rlcollect.replay.storage import Storage
from rlcollect.replay.writers import Writer
from rlcollect.runtime.ray_lease import RayLease, check_init_config, plain, require_ray

# The `ray.remote` options the buffer's actor may be given.
REMOTE_OPTIONS = frozenset(
    {"num_cpus", "num_gpus", "memory", "resources", "scheduling_strategy", "runtime_env"}
)
# A buffer mostly waits for calls: by default it takes no CPU from the collectors' budget.
DEFAULT_REMOTE_CONFIG: dict[str, Any] = {"num_cpus": 0}


def _own(value: Any) -> Any:
    """`value`, or a deep copy of it when it may hold NumPy arrays: Ray hands those over
    read-only, mapped from its object store (torch tensors arrive as copies of their own)."""
    if isinstance(value, TensorDictBase | torch.Tensor):
        return value
    return copy.deepcopy(value)


class ReplayBufferServer:
    """The actor side: one `ReplayBuffer`. A build error is kept and raised by `ready()`.

    The storage, sampler and writer it is given are copied first (a sampler's sum tree is
    NumPy), and so is anything else than tensors that a buffer keeps (items of a ListStorage),
    so that the buffer owns writable memory and pins nothing in Ray's object store.
    """

    def __init__(self, options: dict[str, Any]) -> None:
        self.buffer: ReplayBuffer | None = None
        self.error: BaseException | None = None
        self.tallies: dict[str, int] = {}  # items written by each named writer
        self.sealed: set[str] = set()  # writers counted for good: their writes are refused
        try:
            self.buffer = ReplayBuffer(**copy.deepcopy(options))
        except BaseException as err:  # raised by ready(), with its traceback
            self.error = err

    def ready(self) -> None:
        if self.error is not None:
            raise self.error

    def call(self, method: str, *args: Any) -> Any:
        """`method(*args)` of the buffer (an attribute's value when `method` is a property)."""
        attribute = getattr(self.buffer, method)
        if not callable(attribute):
            return attribute
        return attribute(*(_own(argument) for argument in args))

    def extend_as(self, writer: str, data: Any) -> torch.Tensor:
        """`extend(data)`, counting the items written under `writer`'s name."""
        if writer in self.sealed:
            raise MisuseError(
                f"writer {writer!r} was counted for good (its process ended): its write is "
                f"refused, so that the count its collector took stays what the buffer holds."
            )
        buffer: Any = self.buffer
        before = buffer.write_count
        index = buffer.extend(_own(data))
        self.tallies[writer] = self.tallies.get(writer, 0) + buffer.write_count - before
        return index  # type: ignore[no-any-return]

    def written_by(self, writers: list[str], seal: bool = False) -> list[int]:
        if seal:
            self.sealed.update(writers)
        return [self.tallies.get(writer, 0) for writer in writers]

    def length(self) -> int:
        return len(self.buffer)  # type: ignore[arg-type]

    def get(self, index: Any) -> Any:
        return self.buffer[index]  # type: ignore[index]

    def close(self) -> None:
        if self.buffer is not None:
            self.buffer.close()


class RayReplayBufferClient:
    """Uses a `RayReplayBuffer`'s actor from any process: the same API as `ReplayBuffer`.

    Picklable: a copy finds the actor by name (connecting its process to the cluster first when
    Ray is not initialised there). It cannot close the buffer; its owner does.
    """

    service_backend = "ray"

    def __init__(self, name: str, namespace: str, address: str, handle: Any = None) -> None:
        self.name = name
        self.namespace = namespace
        self.address = address
        self._handle = handle
        self._closed = False

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "namespace": self.namespace, "address": self.address}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def _actor(self) -> Any:
        if self._closed:
            raise MisuseError(f"the replay buffer {self.name!r} is closed; build a new one.")
        if self._handle is None:
            ray = require_ray("RayReplayBuffer")
            if not ray.is_initialized():  # a process outside Ray: join the buffer's cluster
                ray.init(address=self.address, namespace=self.namespace, log_to_driver=False)
            self._handle = ray.get_actor(self.name, namespace=self.namespace)
        return self._handle

    def _remote(self, method: str, *args: Any) -> Any:
        """Run `method` on the actor and return its result; an error the buffer raised comes
        back as itself (chained to Ray's error, which holds the actor's traceback)."""
        ray = require_ray("RayReplayBuffer")
        try:
            return ray.get(getattr(self._actor(), method).remote(*args))
        except ray.exceptions.RayTaskError as err:
            raise err.cause from err
        except ray.exceptions.RayActorError as err:
            raise MisuseError(
                f"the replay buffer actor {self.name!r} is gone (closed, or its node was lost)."
            ) from err

    def _call(self, method: str, *args: Any) -> Any:
        return self._remote("call", method, *args)

    def client(self) -> RayReplayBufferClient:
        """A picklable client of the same buffer (without the right to close it)."""
        return RayReplayBufferClient(self.name, self.namespace, self.address)

    def clients(self, count: int) -> list[RayReplayBufferClient]:
        """`count` clients, one per writer (TorchRL's `clients`)."""
        return [self.client() for _ in range(count)]

    # --- the ReplayBuffer API -------------------------------------------------------------------

    def extend(self, data: Any) -> torch.Tensor:
        """Add a batch of items (see `ReplayBuffer.extend`); returns their slots."""
        return self._call("extend", data)  # type: ignore[no-any-return]

    def extend_as(self, writer: str, data: Any) -> torch.Tensor:
        """`extend(data)`, and the buffer counts the items written under `writer`'s name:
        a writer that dies between a write and its report of it is then counted by asking
        the buffer (`written_by`), which saw every write it acknowledged."""
        return self._remote("extend_as", writer, data)  # type: ignore[no-any-return]

    def written_by(self, writers: Sequence[str], seal: bool = False) -> list[int]:
        """The items written under each name of `writers` with `extend_as` (0 for a name
        never used), as the buffer acknowledged them. `seal=True` counts them for good: a
        write of theirs still on its way (sent by a process that was then ended) is refused,
        so the count stays what the buffer holds."""
        return [int(count) for count in self._remote("written_by", list(writers), seal)]

    def add(self, data: Any) -> int:
        """Add one item; returns its slot."""
        return int(self._call("add", data))

    def sample(self, batch_size: int | None = None, return_info: bool = False) -> Any:
        """Draw a batch (see `ReplayBuffer.sample`)."""
        return self._call("sample", batch_size, return_info)

    def update_priority(self, index: Any, priority: Any) -> None:
        """Set the priorities of the items at `index` (for a `PrioritizedSampler`)."""
        self._call("update_priority", index, priority)

    def __len__(self) -> int:
        return int(self._remote("length"))

    def __getitem__(self, index: Any) -> Any:
        return self._remote("get", index)

    @property
    def write_count(self) -> int:
        """The number of items ever written, by every process."""
        return int(self._call("write_count"))

    @property
    def batch_size(self) -> int | None:
        """The default size of `sample`."""
        return self._call("batch_size")  # type: ignore[no-any-return]

    def empty(self) -> None:
        """Remove every item and reset the cursor and the write count."""
        self._call("empty")

    def state_dict(self) -> dict[str, Any]:
        """The items, the sampler's state (e.g. priorities) and the writer's position."""
        return self._call("state_dict")  # type: ignore[no-any-return]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        self._call("load_state_dict", state_dict)

    def dumps(self, path: str) -> None:
        """Save the buffer into the directory `path` on the actor's node."""
        self._call("dumps", path)

    def loads(self, path: str) -> None:
        """Restore a buffer saved with `dumps` from `path` on the actor's node."""
        self._call("loads", path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, namespace={self.namespace!r})"


def _check_remote_config(remote_config: Any) -> dict[str, Any]:
    if remote_config is None:
        return dict(DEFAULT_REMOTE_CONFIG)
    if not isinstance(remote_config, Mapping):
        raise TypeError(
            f"remote_config must be a dict of ray.remote options (e.g. {{'num_cpus': 1}}); got "
            f"{remote_config!r}."
        )
    for name in remote_config:
        if name not in REMOTE_OPTIONS:
            raise ValueError(
                f"remote_config has {name!r}; the buffer's actor takes {sorted(REMOTE_OPTIONS)}."
            )
    return {**DEFAULT_REMOTE_CONFIG, **plain(remote_config)}


def _check_components(storage: Any, sampler: Any, writer: Any) -> None:
    """The same kinds a `ReplayBuffer` takes, refused here before any actor starts."""
    for name, value, kind, example in (
        ("storage", storage, Storage, "LazyTensorStorage(100_000)"),
        ("sampler", sampler, Sampler, "RandomSampler()"),
        ("writer", writer, Writer, "RoundRobinWriter()"),
    ):
        if value is not None and not isinstance(value, kind):
            raise TypeError(
                f"{name} must be a {kind.__name__} (e.g. {example}), got {type(value).__name__}."
            )


class RayReplayBuffer(RayReplayBufferClient):
    """A `ReplayBuffer` served by a Ray actor: extend and sample it from any process.

    Takes the arguments of `ReplayBuffer` (any storage, sampler and writer of ours; they are
    copied into the actor, where the data lives). `extend`, `add`, `sample`, `len`,
    `write_count`, `update_priority`, `state_dict` / `load_state_dict`, `dumps` / `loads` and
    `empty` work as on a local buffer. Give it to a `RayCollector` as `replay_buffer`: its
    actors extend it directly, so a learner samples while remote actors fill it (Ape-X).

    Keyword Args:
        storage, sampler, writer, batch_size, transform: as for `ReplayBuffer`.
        ray_init_config: `ray.init` arguments, used only when Ray is not initialised here.
        remote_config: `ray.remote` options of the actor (default `{"num_cpus": 0}`).
        name: the actor's name (default: a fresh unique one).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from rlcollect.replay import LazyTensorStorage, RayReplayBuffer
        >>> rb = RayReplayBuffer(
        ...     storage=LazyTensorStorage(100),
        ...     batch_size=4,
        ...     ray_init_config={"num_cpus": 1, "include_dashboard": False},
        ... )
        >>> rb.extend(TensorDict({"observation": torch.arange(8.0)}, [8])).tolist()
        [0, 1, 2, 3, 4, 5, 6, 7]
        >>> len(rb), rb.write_count, rb.sample()["observation"].shape
        (8, 8, torch.Size([4]))
        >>> rb.close()
    """

    def __init__(
        self,
        *,
        storage: Storage | None = None,
        sampler: Sampler | None = None,
        writer: Writer | None = None,
        batch_size: int | None = None,
        transform: Callable[[Any], Any] | None = None,
        ray_init_config: Mapping[str, Any] | None = None,
        remote_config: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        ray = require_ray("RayReplayBuffer")
        _check_components(storage, sampler, writer)
        config = _check_remote_config(remote_config)
        init_config = check_init_config(ray_init_config)
        if name is not None and not (isinstance(name, str) and name):
            raise TypeError(f"name must be a non-empty string or None; got {name!r}.")
        options = {
            "storage": storage,
            "sampler": sampler,
            "writer": writer,
            "batch_size": batch_size,
            "transform": transform,
        }
        self._lease = RayLease.acquire(init_config)
        context = ray.get_runtime_context()
        name = name or f"rlcollect-replay-{uuid.uuid4().hex[:12]}"
        try:
            actor_class = ray.remote(ReplayBufferServer).options(name=name, **config)
            handle = actor_class.remote(options)
            super().__init__(name, context.namespace, context.gcs_address, handle)
            self._remote("ready")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """End the actor (its data with it) and let go of Ray; idempotent."""
        handle, self._handle = getattr(self, "_handle", None), None
        self._closed = True
        ray = require_ray("RayReplayBuffer")
        if handle is not None and ray.is_initialized():  # else it ended with Ray
            with contextlib.suppress(Exception):
                ray.get(handle.close.remote(), timeout=10.0)
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)
        lease = getattr(self, "_lease", None)
        if lease is not None:
            lease.release()

    shutdown = close  # TorchRL's name

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError(
            "a RayReplayBuffer owns its actor and is not pickled; pass rb.client() to other "
            "processes (a RayCollector does so itself)."
        )

    def __enter__(self) -> RayReplayBuffer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

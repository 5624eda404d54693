"""`WorkerPool`: a multi-process collector's workers, their commands, replies and restarts.

Each worker is a `WorkerSlot`: its process handle, the commands it has not answered yet (in
order: a worker answers one command at a time), and its shared-memory batch. Waiting for one
reply handles the replies that come before it (a batch that finished while an update was on
its way), so a collector that keeps batches in flight can still send control commands.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection
import pickle
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

from tensordict import TensorDictBase

from rlcollect.collectors.children import RESTART_ID_GAP
from rlcollect.collectors.multiprocess.ledger import WriteLedger
from rlcollect.collectors.multiprocess.worker import (
    BATCH_REPLY,
    WorkerCommand,
    WorkerSpec,
    describe_command,
    run_collector_worker,
)
from rlcollect.errors import MisuseError, WorkerError, WorkerRaisedError, WorkerTimeoutError
from rlcollect.runtime.processes import (
    HEADER,
    LIVENESS_INTERVAL,
    WorkerHandle,
    encode,
    workers_finalizer,
)

# Commands whose failure in a healthy worker leaves it (and the collector) usable.
CONTROL_COMMANDS = frozenset(
    {
        WorkerCommand.SEED,
        WorkerCommand.STATE_DICT,
        WorkerCommand.LOAD_STATE_DICT,
        WorkerCommand.STATS,
        WorkerCommand.PAUSE,
        WorkerCommand.RESUME,
        WorkerCommand.STOP,
        WorkerCommand.TRAJECTORY_IDS,
    }
)
# Seconds a closing worker gets to close its envs before it is terminated.
CLOSE_TIMEOUT = 5.0
# Where torch names a shared-memory segment while it makes one (`torch_<pid>_...`); it unlinks
# the name at once, so one still there belongs to a process killed in between.
SHARED_MEMORY = Path("/dev/shm")


def remove_orphaned_segments(pid: int) -> None:
    """Remove the shared-memory names torch was making in the dead process `pid`."""
    with contextlib.suppress(OSError):
        for path in SHARED_MEMORY.glob(f"torch_{pid}_*"):
            with contextlib.suppress(OSError):
                path.unlink()


# Fresh workers tried in a row for one that died, when each is killed by a signal while starting.
RESTART_ATTEMPTS = 10


@dataclass
class WorkerSlot:
    """One worker of a pool: its process, unanswered commands and latest batch."""

    index: int
    handle: WorkerHandle
    frames_per_batch: int = 0
    messages: deque[bytes] = field(default_factory=deque)  # sent, not answered yet, in order
    batch: TensorDictBase | None = None
    extras: dict[Any, Any] | None = None  # the latest batch's non-tensor entries
    has_batch: bool = False
    frames: int = 0
    last_frames: int = 0
    # Replay-buffer frames of this worker the collector has counted: those its replies
    # reported, and, when it died, every write its commits kept.
    counted: int = 0
    restarts: int = 0
    policy_version: int = 0
    seed: int | None = None
    # While it fills the buffer in the background: its share of frames (0: no limit) and the
    # frames it had written when it started.
    background: tuple[int, int] | None = None
    deadline: float = float("inf")
    limit: float | None = None  # the timeout its pending command was given, for errors
    # A weight update that came while it collected a batch, sent before its next command
    # (a `updates.HeldUpdate`).
    held_update: Any = None

    @property
    def pending(self) -> list[int]:
        """The commands sent and not answered yet, oldest first."""
        return [HEADER.unpack_from(message)[0] for message in self.messages]

    def send(self, command: WorkerCommand, argument: int = 0, payload: bytes = b"") -> None:
        """Send a command (see `send_message`)."""
        self.send_message(encode(command, argument, payload))

    def send_message(self, message: bytes) -> None:
        """Send an encoded command; one sent to a dead worker stays unanswered, so that
        waiting for its reply reports the death (or restarts the worker and sends it again)."""
        self.messages.append(message)
        with contextlib.suppress(WorkerError):
            self.handle.send(message)

    def answered(self) -> None:
        self.messages.popleft()

    def launch(self, deadline: float, limit: float | None = None) -> None:
        """Ask for the next batch, to be answered by `deadline` (a monotonic time, `limit`
        seconds from now)."""
        self.has_batch = False
        self.deadline = deadline
        self.limit = limit
        self.send(WorkerCommand.COLLECT)

    def batch_with_extras(self) -> TensorDictBase:
        """The worker's batch (shared memory) with its non-tensor entries, if any; the shared
        batch itself is left as it is."""
        if self.batch is None:
            raise RuntimeError(f"worker {self.index} answered COLLECT without a batch.")
        if not self.extras:
            return self.batch
        batch = self.batch.copy()
        for key, value in self.extras.items():
            batch.set(key, value)
        return batch

    def take_batch(self, payload: bytes) -> None:
        """Record a COLLECT reply: the batch now waits in shared memory."""
        frames, version, with_payload = BATCH_REPLY.unpack_from(payload)
        self.extras = None
        if with_payload:
            handle, self.extras = pickle.loads(payload[BATCH_REPLY.size :])
            if handle is not None:
                self.batch = handle
        self.has_batch = True
        self.frames += frames
        self.last_frames = frames
        self.policy_version = version


class WorkerPool:
    """Starts, commands, restarts and shuts down the worker processes of a collector.

    Args:
        specs: one `WorkerSpec` per worker.
        context: the multiprocessing context.

    Keyword Args:
        num_sub_threads: torch threads per worker.
        worker_timeout: seconds a worker may take to answer a command (a batch included).
        restart_dead_workers: replace a worker that died instead of failing.
        startup_timeout: seconds the workers may take to build their collectors.
        on_failure: called before a worker failure is raised (the owner shuts down).
        current_weights: `() -> (weights, version)`, what a restarted worker starts with.
        ledger: what each worker committed to the replay buffer.
        await_ready: wait here until every worker has built its collector (a failure raises
            here); otherwise each worker's readiness is read at the first exchange with it,
            and until then its `frames_per_batch` is the one its spec asks for.
    """

    def __init__(
        self,
        specs: Sequence[WorkerSpec],
        context: BaseContext,
        *,
        num_sub_threads: int,
        worker_timeout: float | None,
        restart_dead_workers: bool,
        startup_timeout: float,
        on_failure: Callable[[], None],
        current_weights: Callable[[], tuple[dict[str, Any] | None, int]],
        ledger: WriteLedger,
        await_ready: bool = True,
    ) -> None:
        self.specs = list(specs)
        self.context = context
        self.num_sub_threads = num_sub_threads
        self.worker_timeout = worker_timeout
        self.restart_dead_workers = restart_dead_workers
        self.on_failure = on_failure
        self.current_weights = current_weights
        self.ledger = ledger
        # Called with the slots about to be sent a command (first thing, under the lock): the
        # owner sends the weight updates held for them (see `updates.WeightDelivery`).
        self.before_command: Callable[[Sequence[WorkerSlot]], None] = lambda slots: None
        # Held by every exchange with the workers: the watchdog thread restarts workers while
        # the user's thread may send commands.
        self.lock = threading.RLock()
        # A failure the watchdog found, raised by the next call.
        self.failure: BaseException | None = None
        self._handles: list[WorkerHandle] = []
        self._finalizer = workers_finalizer(
            self, self._handles, encode(WorkerCommand.CLOSE), CLOSE_TIMEOUT
        )
        self.slots: list[WorkerSlot] = []
        try:
            for index, spec in enumerate(self.specs):
                slot = WorkerSlot(index, self._start_process(index), spec.frames_per_batch)
                self.slots.append(slot)
                if not await_ready:
                    slot.messages.append(encode(WorkerCommand.READY))  # answered first
            for slot in self.slots if await_ready else ():
                self._await_ready(slot, startup_timeout)
        except BaseException as err:
            self.close()
            # A worker failing to build its collector raises what the Collector raises here
            # (a TypeError for a policy that cannot be wrapped), with the worker's traceback.
            same = err.as_raised() if isinstance(err, WorkerRaisedError) else None
            if same is None:
                raise
            raise same from err

    # --- processes ------------------------------------------------------------------------------

    def _start_process(self, index: int) -> WorkerHandle:
        spec = self.specs[index]
        # Packed again at each start: a restarted worker gets the shared objects too.
        payload, shared = spec.payload(), spec.shared
        handle = WorkerHandle(
            index,
            self.context,
            run_collector_worker,
            (payload, shared),
            name=f"rlcollect-collector-worker-{index}",
            daemon=False,  # a worker may run a ParallelEnv or workers of its own
            num_threads=self.num_sub_threads,
            describe=describe_command,
        )
        self._handles.append(handle)
        return handle

    def _await_ready(self, slot: WorkerSlot, timeout: float) -> None:
        ready = pickle.loads(slot.handle.receive(timeout))
        slot.frames_per_batch = int(ready["frames_per_batch"])

    def restart(self, slot: WorkerSlot, weights: dict[str, Any] | None, version: int) -> None:
        """Replace the dead worker of `slot` by a fresh one with the current weights, its seed
        moved on, and trajectory ids of its own; commands it had not answered are sent again
        (but an update, which the fresh worker starts with)."""
        lost = [  # an update and a start, the fresh worker starts with (and is awaited)
            message
            for message in slot.messages
            if HEADER.unpack_from(message)[0]
            not in (WorkerCommand.UPDATE_WEIGHTS, WorkerCommand.START, WorkerCommand.READY)
        ]
        spec = self.specs[slot.index]
        spec.weights, spec.version = weights, version
        slot.messages.clear()
        slot.batch, slot.has_batch = None, False
        for attempt in range(RESTART_ATTEMPTS):
            offset, stride = spec.trajectory_ids
            spec.trajectory_ids = (offset + stride * RESTART_ID_GAP, stride)
            old = slot.handle
            with contextlib.suppress(ValueError):
                self._handles.remove(old)
            old_pid = old.pid
            old.finish(timeout=0.1)
            remove_orphaned_segments(old_pid)
            slot.handle = self._start_process(slot.index)
            slot.restarts += 1
            if self.ledger.buffer is not None:
                # What the dead worker committed stays in the buffer: count it, nothing else.
                slot.counted = self.ledger.written()[slot.index]
            try:
                self._await_ready(slot, CLOSE_TIMEOUT * 60)
                break
            except WorkerError:
                # Killed while starting (by a signal: another try), or broken (raised).
                if slot.handle.process.exitcode is None or slot.handle.process.exitcode >= 0:
                    raise
                if attempt == RESTART_ATTEMPTS - 1:
                    raise
        if slot.seed is not None:
            slot.send(WorkerCommand.SEED, slot.seed + 7919 * slot.restarts)
            self.await_reply(slot, WorkerCommand.SEED)
        if slot.background is not None:
            self.start_background(slot, *slot.background)
        for message in lost:
            slot.send_message(message)

    # --- commands and replies -------------------------------------------------------------------

    def request(
        self,
        slots: Sequence[WorkerSlot],
        command: WorkerCommand,
        argument: int = 0,
        payload: bytes = b"",
        timeout: float | None = None,
    ) -> list[bytes]:
        """Send `command` to every slot of `slots`, then wait for each answer (by a common
        deadline, `timeout` or the worker timeout)."""
        with self.lock:
            self.post(slots, command, argument, payload)
            limit = self.worker_timeout if timeout is None else timeout
            for slot in slots:
                slot.limit = limit
            deadline = self.deadline(timeout)
            return [self.await_reply(slot, command, deadline) for slot in slots]

    def post(
        self,
        slots: Sequence[WorkerSlot],
        command: WorkerCommand,
        argument: int = 0,
        payload: bytes = b"",
    ) -> None:
        """Send `command` to every slot of `slots` without waiting: each answer is read by
        the next exchange with that worker, or by `settle`."""
        with self.lock:
            self.check_open()
            self.before_command(slots)
            for slot in slots:
                slot.send(command, argument, payload)

    def launch(self, slot: WorkerSlot, deadline: float) -> None:
        """Ask `slot` for its next batch by `deadline` (see `WorkerSlot.launch`), after what
        was held for it."""
        with self.lock:
            self.before_command([slot])
            slot.launch(deadline, self.worker_timeout)

    def settle(self, command: WorkerCommand, timeout: float | None = None) -> None:
        """Wait (by `timeout` or the worker timeout) until every worker has answered the
        `command`s `post` sent it; batches that finish on the way are recorded."""
        with self.lock:
            self.check_open()
            deadline = self.deadline(timeout)
            for slot in self.slots:
                if command in slot.pending:
                    self.await_reply(slot, command, deadline)

    def deadline(self, timeout: float | None = None) -> float:
        timeout = self.worker_timeout if timeout is None else timeout
        return float("inf") if timeout is None else time.monotonic() + timeout

    def await_reply(
        self, slot: WorkerSlot, command: WorkerCommand, deadline: float = float("inf")
    ) -> bytes:
        """Read `slot`'s replies up to the one to `command` and return its payload; batches
        that finish on the way are recorded. A dead worker is restarted when allowed. An
        exception a healthy worker raised in a control command (a bad seed or state) is raised
        and the collector goes on; any other failure shuts the collector down and raises."""
        try:
            return self._read_replies(slot, command, deadline)
        except WorkerRaisedError as err:
            if err.recoverable:
                raise
            self._fail(slot, err)
            raise
        except BaseException as err:
            self._fail(slot, err)
            raise

    def _read_replies(self, slot: WorkerSlot, command: WorkerCommand, deadline: float) -> bytes:
        while True:
            expected = slot.pending[0]
            timeout = None
            if deadline != float("inf"):
                timeout = max(0.0, deadline - time.monotonic())
            try:
                payload = slot.handle.receive(timeout, limit=slot.limit)
                self._record(slot, expected, payload)
            except WorkerRaisedError as err:
                slot.answered()
                err.recoverable = expected in CONTROL_COMMANDS and len(err.path) == 1
                same = err.as_raised() if expected == WorkerCommand.READY else None
                if same is not None:
                    raise same from err  # as the constructor raises it (see __init__)
                raise
            except WorkerError:
                if not (self.restart_dead_workers and not slot.handle.process.is_alive()):
                    raise
                self.restart(slot, *self.current_weights())
                if command not in slot.pending:
                    return b""
                # The fresh worker answers again what was lost: give it a full timeout.
                deadline = slot.deadline = max(deadline, self.deadline())
                continue
            slot.answered()
            if expected == command:
                return payload

    def _record(self, slot: WorkerSlot, answered: int, payload: bytes) -> None:
        """Record what a reply to `answered` brings: a batch, or a worker's readiness."""
        if answered == WorkerCommand.COLLECT:
            self._take_batch(slot, payload)
        elif answered == WorkerCommand.READY:
            slot.frames_per_batch = int(pickle.loads(payload)["frames_per_batch"])

    def _take_batch(self, slot: WorkerSlot, payload: bytes) -> None:
        """Record a COLLECT reply. Its shared batch's handle is fetched from the worker: one
        killed right after it replied cannot hand it over, and counts as dead."""
        try:
            slot.take_batch(payload)
        except (OSError, EOFError) as err:
            raise slot.handle.death_error() from err
        if self.ledger.buffer is not None:
            slot.counted += slot.last_frames

    def _fail(self, slot: WorkerSlot, err: BaseException) -> None:
        """End what a failure leaves running: busy workers at once (a hung one too), then
        the owner (which shuts the collector down)."""
        hung = isinstance(err, WorkerTimeoutError) and err.path == (slot.index,)
        self.kill_busy(spare=None if hung else slot)
        self.on_failure()

    def await_first_batch(self, slots: Sequence[WorkerSlot]) -> WorkerSlot:
        """The first slot of `slots` with a batch waiting: one already recorded, else the first
        whose COLLECT reply arrives (each slot by its own deadline, set when it was sent).

        Waits without the pool's lock and reads under it, so that another thread (a weight
        update sent while a batch is awaited, as TorchRL's `RPCCollector` sends them) talks
        to the workers in between; what it reads on the way is recorded, and seen here.
        """
        while True:
            with self.lock:
                for slot in slots:
                    if slot.has_batch:
                        return slot
                waiting = [slot for slot in slots if WorkerCommand.COLLECT in slot.pending]
                if not waiting:
                    raise MisuseError("no worker is collecting; send COLLECT first.")
                connections = [slot.handle.connection for slot in waiting]
            ready = set(multiprocessing.connection.wait(connections, LIVENESS_INTERVAL))
            with self.lock:
                answered = self._read_first_batch(waiting, ready)
            if answered is not None:
                return answered

    def _read_first_batch(
        self, waiting: Sequence[WorkerSlot], ready: set[Any]
    ) -> WorkerSlot | None:
        """Read the replies of the `ready` (or late) slots of `waiting`, in the caller's order
        (not the OS's: a worker always ready first would starve the others, and hide one that
        died); the first that brings a batch, else None. A reply another thread read since
        the wait is not waited for again."""
        now = time.monotonic()
        for slot in waiting:
            if slot.has_batch:
                return slot
            if WorkerCommand.COLLECT not in slot.pending:
                continue
            late = now >= slot.deadline
            if late or (slot.handle.connection in ready and slot.handle.poll(0)):
                self.await_reply(slot, WorkerCommand.COLLECT, slot.deadline)
                if slot.has_batch:
                    return slot
        return None

    def start_background(self, slot: WorkerSlot, share: int, written_before: int) -> None:
        """Have `slot` fill the buffer in the background with what is left of `share` frames
        (0: no limit), counting from `written_before` (what it had written when its share was
        set): a restarted worker goes on with the rest of its predecessor's share."""
        now = self.ledger.written()[slot.index]
        left = max(0, share - (now - written_before)) if share else 0
        slot.background = (left, now)
        if share and not left:
            return
        self.before_command([slot])
        slot.send(WorkerCommand.START, left)
        self.await_reply(slot, WorkerCommand.START)

    def check_alive(self, keep_failure: bool = False) -> None:
        """Find workers that died while nobody waited on them (filling the buffer in the
        background): restart each when allowed, else shut down and raise its death (with
        `keep_failure`, also kept for the next call to raise, before the shutdown starts)."""
        with self.lock:
            self.check_open()
            for slot in self.slots:
                if slot.handle.process.is_alive():
                    continue
                if self.restart_dead_workers:
                    self.restart(slot, *self.current_weights())
                    continue
                error = slot.handle.death_error()
                if keep_failure:
                    self.failure = error
                self._fail(slot, error)
                raise error

    def count_written(self) -> int:
        """Count every frame the workers committed to the buffer (once none writes: after
        background collection), and return the frames counted."""
        if self.ledger.buffer is not None:
            for slot, written in zip(self.slots, self.ledger.written(), strict=True):
                slot.counted = written
        return self.counted()

    def counted(self) -> int:
        """Replay-buffer frames counted so far, over every worker."""
        return sum(slot.counted for slot in self.slots)

    def kill_busy(self, spare: WorkerSlot | None = None) -> None:
        """End every worker still busy with a command (but `spare`) at once: after a failure
        the collector shuts down within a bounded time, without waiting for batches or hung
        steps to finish. A worker's own workers follow it through their lifelines."""
        for slot in self.slots:
            if slot is not spare and slot.pending and self.alive(slot):
                slot.handle.process.kill()

    # --- state ----------------------------------------------------------------------------------

    @property
    def pids(self) -> list[int]:
        """The process ids of the workers (empty once closed); read under the pool's lock, so
        never while a restart swaps a dead worker's handle for a fresh one's."""
        with self.lock:
            return [slot.handle.pid for slot in self.slots] if self.is_open else []

    @property
    def is_open(self) -> bool:
        """Whether the workers run (until `close()`)."""
        return bool(self._handles)

    def check_open(self) -> None:
        """Raise what the watchdog found (once), or that the workers were shut down."""
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure
        if not self._handles:
            raise MisuseError("the collector is shut down; build a new one.")

    def alive(self, slot: WorkerSlot) -> bool:
        try:
            return self.is_open and slot.handle.process.is_alive()
        except ValueError:  # its process object was closed: a restart replaced it
            return False

    def close(self) -> None:
        """Stop every worker (bounded: a worker that does not exit in time is terminated) and
        unmap their shared-memory batches. A worker still busy with a command (a batch in
        flight, a hung step) is ended at once: its batch is abandoned."""
        with self.lock:
            was_open = self.is_open
            pids = self.pids
            if was_open:
                self.kill_busy()
            self._finalizer()
            for pid in pids:
                remove_orphaned_segments(pid)
            for slot in self.slots:
                slot.batch, slot.has_batch = None, False
            if was_open:
                # A worker ended in the middle of a batch may have committed it unreplied.
                self.count_written()

"""`ActorFleet`: a RayCollector's actors, their calls and replies, failures and restarts.

Every call to an actor is a `Call` with a deadline. Waiting for several calls settles them in
the order they finish, so a failed or dead actor is reported as soon as Ray knows of it, whatever
the others are doing. An actor that died is restarted (by Ray, or created again when Ray gave up
on it) when the collector allows it; the call it lost is sent again once the collector has
restored the actor's state.
"""

from __future__ import annotations

import contextlib
import re
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from rlcollect.collectors.ray.actor import ActorSpec, CollectorActor, NeedsRestoreError
from rlcollect.errors import WorkerError, WorkerTimeoutError
from rlcollect.runtime.ray_lease import require_ray

# Seconds a dead actor may take to come back (Ray starts a new process that imports torch).
RESTART_TIMEOUT = 120.0
# Seconds actors get to close their collectors before they are killed.
CLOSE_TIMEOUT = 10.0
# Ray colours the traceback it carries for terminals.
TERMINAL_COLOURS = re.compile(r"\x1b\[[0-9;]*m")
# How often a call waiting on a restarting actor asks whether it is back (seconds).
RESTART_POLL = 0.1


def remote_traceback(err: BaseException) -> str:
    """The actor's own traceback that a Ray error carries, as plain text."""
    return TERMINAL_COLOURS.sub("", str(err))


class ActorError(WorkerError):
    """A collector actor failed: it raised, died, or did not answer in time.

    `worker` is the actor's index; the message carries the actor's own traceback.
    """

    def __init__(self, index: int, reason: str, remote_traceback: str = "") -> None:
        super().__init__(index, reason, remote_traceback)
        text = f"collector actor {index} failed: {reason}"
        if remote_traceback:
            text += f"\n--- traceback in collector actor {index} ---\n{remote_traceback}"
        self.args = (text,)


class ActorTimeoutError(ActorError, WorkerTimeoutError):
    """A collector actor did not answer within its deadline."""


@dataclass
class ActorSlot:
    """One actor of the fleet: its handle, how to build it again, and what it reported."""

    index: int
    handle: Any
    spec: ActorSpec
    remote_config: dict[str, Any]
    frames_per_batch: int = 0
    pid: int = 0
    node_id: str = ""
    restarts: int = 0
    policy_version: int = 0
    counted: int = 0  # frames the collector counted from the actor's current process


@dataclass
class Call:
    """A method call in flight on one actor."""

    slot: ActorSlot
    method: str
    args: tuple[Any, ...]
    ref: Any
    deadline: float
    fatal: bool = True  # whether its failure ends the collector
    incarnation: int = 0  # the actor's restarts when the call was sent
    restarting: bool = False  # its actor died: `ref` is a `ready()` awaiting its return
    retry_at: float = 0.0  # with `ref` None: when to ask the restarting actor again


def _kill(handles: list[Any]) -> None:
    """Kill every actor of `handles` (no restart); what is already gone is ignored, and so is
    everything once Ray is down (calling it then would start a new Ray)."""
    ray = require_ray("ActorFleet")
    if not ray.is_initialized():
        handles.clear()
        return
    for handle in handles:
        with contextlib.suppress(Exception):
            ray.kill(handle, no_restart=True)
    handles.clear()


class ActorFleet:
    """Creates the collector actors, calls them, restarts them, and ends them.

    Keyword Args:
        restart_dead: restart an actor that dies (Ray's actor restarts), else fail.
        call_timeout: seconds an actor may take to answer a call (a batch included); None waits.
        on_restart: called with the slot of an actor that came back, to restore its state.
        on_failure: called before a failure is raised (the collector shuts down).
    """

    def __init__(
        self,
        *,
        restart_dead: bool,
        call_timeout: float | None,
        on_restart: Callable[[ActorSlot], None],
        on_failure: Callable[[], None],
    ) -> None:
        self.ray = require_ray("RayCollector")
        self.restart_dead = restart_dead
        self.call_timeout = call_timeout
        self.on_restart = on_restart
        self.on_failure = on_failure
        self._remote_class = self.ray.remote(CollectorActor)
        self._policy: Any = None
        self._handles: list[Any] = []
        self._finalizer = weakref.finalize(self, _kill, self._handles)
        self.slots: list[ActorSlot] = []

    def launch(
        self,
        specs: Sequence[ActorSpec],
        remote_configs: Sequence[dict[str, Any]],
        policy: Any,
        startup_timeout: float,
    ) -> None:
        """Create one actor per spec, with its `ray.remote` options, and wait until every one
        has built its collector (`startup_timeout` seconds, scheduling included)."""
        try:
            # Once in the object store for every actor; restartable actors take it inline, as
            # Ray warns about restart arguments that live in the object store.
            put = policy is not None and not self.restart_dead
            self._policy = self.ray.put(policy) if put else policy
            for spec, config in zip(specs, remote_configs, strict=True):
                self.slots.append(ActorSlot(spec.index, self._create(spec, config), spec, config))
            deadline = time.monotonic() + startup_timeout
            calls = [self.submit(slot, "ready", deadline=deadline) for slot in self.slots]
            for slot, info in zip(self.slots, self.gather(calls), strict=True):
                self._record(slot, info)
        except BaseException:
            self.close(graceful=False)
            raise

    def _create(self, spec: ActorSpec, config: dict[str, Any]) -> Any:
        options = {**config, "max_restarts": -1 if self.restart_dead else 0, "max_task_retries": 0}
        handle = self._remote_class.options(**options).remote(spec, self._policy)
        self._handles.append(handle)
        return handle

    @staticmethod
    def _record(slot: ActorSlot, info: dict[str, Any]) -> None:
        slot.frames_per_batch = int(info["frames_per_batch"])
        slot.pid, slot.node_id = int(info["pid"]), str(info["node_id"])

    # --- calls ----------------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return bool(self._handles)

    def deadline(self, timeout: float | None = None) -> float:
        timeout = self.call_timeout if timeout is None else timeout
        return float("inf") if timeout is None else time.monotonic() + timeout

    def submit(
        self,
        slot: ActorSlot,
        method: str,
        *args: Any,
        deadline: float | None = None,
        fatal: bool = True,
    ) -> Call:
        """Start `method(*args)` on the actor of `slot`."""
        ref = getattr(slot.handle, method).remote(*args)
        deadline = self.deadline() if deadline is None else deadline
        return Call(slot, method, args, ref, deadline, fatal, slot.restarts)

    def call(
        self,
        slots: Sequence[ActorSlot],
        method: str,
        *args: Any,
        timeout: float | None = None,
        fatal: bool = True,
    ) -> list[Any]:
        """`method(*args)` on every actor of `slots` at once; their results, in order."""
        deadline = self.deadline(timeout)
        calls = [self.submit(s, method, *args, deadline=deadline, fatal=fatal) for s in slots]
        return self.gather(calls)

    def gather(self, calls: Sequence[Call]) -> list[Any]:
        """The results of `calls`, in order, settled as they finish."""
        results: dict[int, Any] = {}
        waiting = list(calls)
        while waiting:
            call, result = self.first(waiting)
            results[id(call)] = result
            waiting.remove(call)
        return [results[id(call)] for call in calls]

    def first(self, calls: Sequence[Call]) -> tuple[Call, Any]:
        """The first of `calls` to finish and its result. A call lost with a dead actor waits
        (without holding the others up) for the actor to come back, is sent again once the
        collector restored it, and is waited for again. Ctrl-C while waiting ends every actor
        at once (a batch in flight is abandoned) and shuts the collector down, as a failure
        does, before the `KeyboardInterrupt` goes on."""
        try:
            return self._first(calls)
        except KeyboardInterrupt:
            self.close(graceful=False)
            self.on_failure()
            raise

    def _first(self, calls: Sequence[Call]) -> tuple[Call, Any]:
        while True:
            now = time.monotonic()
            for call in calls:
                if call.ref is None and now >= call.retry_at:
                    call.ref = call.slot.handle.ready.remote()  # ask again if it is back
            late = [call for call in calls if now >= call.deadline]
            if late:
                self.fail(self._late(late[0]))
            wake = min(call.deadline if call.ref is not None else call.retry_at for call in calls)
            left = None if wake == float("inf") else max(0.0, wake - now)
            refs = [call.ref for call in calls if call.ref is not None]
            ready: list[Any] = []
            if refs:
                ready, _ = self.ray.wait(refs, num_returns=1, timeout=left)
            else:
                time.sleep(left or 0.0)
            if not ready:
                continue
            call = next(c for c in calls if c.ref is not None and c.ref == ready[0])
            settled, result = self._settle(call)
            if settled:
                return call, result

    @staticmethod
    def _late(call: Call) -> ActorTimeoutError:
        if call.restarting:
            return ActorTimeoutError(call.slot.index, "it did not come back after dying")
        return ActorTimeoutError(call.slot.index, f"{call.method}() did not answer in time")

    def _settle(self, call: Call) -> tuple[bool, Any]:
        """(True, result) for a finished call; (False, None) while it waits for its actor to
        come back, or was sent again."""
        if call.restarting:
            self._await_restart(call)
            return False, None
        exceptions = self.ray.exceptions
        try:
            return True, self.ray.get(call.ref)
        except exceptions.RayTaskError as err:
            if isinstance(err.cause, NeedsRestoreError):  # restarted while nobody waited
                self._recover(call)
                return False, None
            cause = err.cause
            reason = f"{call.method}() raised {type(cause).__name__}: {cause}"
            failure = ActorError(call.slot.index, reason, remote_traceback(err))
            if not call.fatal:
                raise failure from cause
            self.fail(failure, cause)
        except exceptions.RayActorError as err:
            if self.restart_dead:
                self._recover(call)
                return False, None
            reason = f"the actor died while running {call.method}() ({type(err).__name__})"
            self.fail(ActorError(call.slot.index, reason, remote_traceback(err)), err)

    def fail(self, failure: ActorError, cause: BaseException | None = None) -> NoReturn:
        """End every actor at once (a busy or hung one too), let the collector shut down,
        and raise `failure`."""
        self.close(graceful=False)
        self.on_failure()
        raise failure from cause

    # --- restarts -------------------------------------------------------------------------------

    def _recover(self, call: Call) -> None:
        """Have `call` wait for its actor to come back, or send it again at once when another
        call already saw the actor back."""
        if call.slot.restarts != call.incarnation:
            self._resend(call)
            return
        call.restarting = True
        call.ref = call.slot.handle.ready.remote()  # answered once Ray restarted it
        call.deadline = time.monotonic() + RESTART_TIMEOUT

    def _await_restart(self, call: Call) -> None:
        """Settle a `ready()` asked of a dead actor: still restarting (ask again shortly),
        given up by Ray (create it again), or back (restore it, then send `call` again)."""
        exceptions, slot = self.ray.exceptions, call.slot
        try:
            info = self.ray.get(call.ref)
        except exceptions.ActorUnavailableError:  # restarting: ask again shortly
            call.ref, call.retry_at = None, time.monotonic() + RESTART_POLL
            return
        except exceptions.ActorDiedError:  # Ray will not restart it: make a new one
            slot.handle = self._create(slot.spec, slot.remote_config)
            call.ref = slot.handle.ready.remote()
            return
        except exceptions.RayTaskError as err:
            reason = f"rebuilding its collector raised {type(err.cause).__name__}: {err.cause}"
            self.fail(ActorError(slot.index, reason, remote_traceback(err)), err.cause)
        self._record(slot, info)
        slot.restarts += 1
        call.restarting = False
        self.on_restart(slot)
        self._resend(call)

    def _resend(self, call: Call) -> None:
        call.incarnation = call.slot.restarts
        call.ref = getattr(call.slot.handle, call.method).remote(*call.args)
        call.deadline = max(call.deadline, self.deadline())

    # --- end ------------------------------------------------------------------------------------

    def process_ids(self) -> list[int]:
        """Every actor's process id and those of its worker processes."""
        return [pid for pids in self.call(self.slots, "process_ids") for pid in pids]

    def wait_ended(self, timeout: float) -> None:
        """Wait (up to `timeout` seconds in all) until Ray reports every killed actor dead, so
        that nothing it sent before it died is still on its way."""
        if not self.ray.is_initialized():
            return
        deadline = time.monotonic() + timeout
        for slot in self.slots:
            while time.monotonic() < deadline:
                try:  # answered while the kill is not through yet
                    self.ray.get(slot.handle.ready.remote(), timeout=deadline - time.monotonic())
                except Exception:  # dead (RayActorError), or a build error, or out of time
                    break
                time.sleep(RESTART_POLL)

    def close(self, graceful: bool = True) -> None:
        """Kill every actor; `graceful` first lets them close their collectors (and worker
        processes), for up to `CLOSE_TIMEOUT` seconds. Idempotent."""
        if not self._handles:
            return
        if graceful and self.ray.is_initialized():
            refs = []
            for handle in self._handles:
                with contextlib.suppress(Exception):
                    refs.append(handle.close.remote())
            with contextlib.suppress(Exception):
                self.ray.wait(refs, num_returns=len(refs), timeout=CLOSE_TIMEOUT)
        self._finalizer()

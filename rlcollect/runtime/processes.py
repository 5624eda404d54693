"""One worker-process mechanism for `ParallelEnv` and the multi-process collectors.

A worker is a process started from a preloaded fork server, with a duplex pipe for commands
and a one-way *lifeline* pipe that the parent never writes to: when the parent dies, the
worker reads EOF on it and exits, so no worker outlives its parent even while it is busy.
Messages are bytes: a 9-byte header (command, integer argument) and an optional payload.
Every command gets one reply: a status byte (`OK` or `ERROR`) and, where the command returns
something, a payload. An `ERROR` reply carries the exception's message, the worker's traceback
and the path of the failing worker below this one (for workers that have workers).
"""

from __future__ import annotations

import contextlib
import enum
import multiprocessing
import multiprocessing.util
import os
import pickle
import select
import signal
import struct
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any

import torch

from rlcollect.errors import WorkerError, WorkerRaisedError, WorkerTimeoutError
from rlcollect.runtime.exits import exit_promptly_on_interrupt
from rlcollect.runtime.fork_server import share_parent_fork_server

HEADER = struct.Struct("<Bq")
OK = b"\x00"
ERROR = b"\x01"
# How often a waiting parent checks that a silent worker is still alive (seconds).
LIVENESS_INTERVAL = 0.5
# Where our workers' shutdown runs among multiprocessing's exit finalizers (any value >= 0
# runs before it joins the children).
WORKERS_EXIT_PRIORITY = 10
# Modules every worker process needs; the fork server imports them once, so each worker is
# forked torch-ready in milliseconds instead of importing torch for seconds. `exits` first: it
# lets the server end at once when its parent does (see rlcollect.runtime.exits).
PRELOADED_MODULES = ["rlcollect.runtime.exits", "rlcollect"]


def threads_beside(workers: int) -> int:
    """Torch threads for a process that computes beside `workers` busy worker processes: the
    cores they leave, at least one (so that together they do not oversubscribe the cores)."""
    return max(1, (os.cpu_count() or 1) - workers)


def encode(command: int, argument: int = 0, payload: bytes = b"") -> bytes:
    """The message for `command`: header, then the payload (if any)."""
    return HEADER.pack(command, argument) + payload


def command_describer(
    command_set: type[enum.IntEnum], formats: Mapping[int, str], default: str = "{name}"
) -> Callable[[bytes], str]:
    """A `describe(message)` for error messages over one server's command set: the call a
    message stands for, e.g. `set_seed(3)`. `formats` maps a command to a template over
    `{name}` (the command's name, lower case) and `{argument}` (the header's argument);
    other commands use `default`."""

    def describe(message: bytes) -> str:
        command, argument = HEADER.unpack_from(message)
        template = formats.get(command, default)
        return template.format(name=command_set(command).name.lower(), argument=argument)

    return describe


def error_reply(err: BaseException, context: str) -> bytes:
    """The `ERROR` reply: the exception's message, the worker's traceback, for a
    `WorkerError` raised by this worker's own workers the path of the worker that failed, and
    the exception's type when a built-in one (the parent may raise it as that type)."""
    if isinstance(err, WorkerError):
        raised = getattr(err, "raised", None)
        details = (f"{context} failed: {err.reason}", err.remote_traceback, err.path, raised)
    else:
        builtin = type(err).__module__ == "builtins" and isinstance(err, Exception)
        message = f"{context} raised {type(err).__name__}: {err}"
        details = (message, traceback.format_exc(), (), type(err) if builtin else None)
    return ERROR + pickle.dumps(details)


def serve_commands(
    connection: Connection,
    handle: Callable[[int, int, bytes], bytes],
    close_command: int,
    describe: Callable[[bytes], str],
    acknowledge_close: bool = False,
) -> None:
    """A worker's command loop: answer each message with `OK` and what `handle(command,
    argument, message)` returns, or with the error and its traceback, until `close_command`
    (answered with `OK` when `acknowledge_close`) or until the parent's pipe closes."""
    while True:
        try:
            message = connection.recv_bytes()
        except (EOFError, OSError):
            return
        command, argument = HEADER.unpack_from(message)
        if command == close_command:
            if acknowledge_close:
                connection.send_bytes(OK)
            return
        try:
            reply = OK + handle(command, argument, message)
        except BaseException as err:  # SystemExit / KeyboardInterrupt from an env too
            reply = error_reply(err, describe(message))
        connection.send_bytes(reply)


def default_start_method() -> str:
    """The default start method: "forkserver" where the platform has it, else "spawn"."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def worker_context(mp_start_method: str | None) -> BaseContext:
    """The multiprocessing context for workers, with the fork server preloaded (or, in a
    process a fork server forked, that server: rlcollect.runtime.fork_server)."""
    method = mp_start_method or default_start_method()
    if method not in multiprocessing.get_all_start_methods():
        raise ValueError(
            f"mp_start_method={method!r} is not available here; use one of "
            f"{multiprocessing.get_all_start_methods()}."
        )
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(PRELOADED_MODULES)
        share_parent_fork_server()
    return context


MAIN_GUARD = 'if __name__ == "__main__":'


def refuse_while_importing_main(name: str) -> None:
    """Refuse to start a worker from a process that is still importing the main script: a
    script without the `__main__` guard would otherwise start workers in every worker."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError(
            f"{name} would start a worker process while this worker process is importing "
            f"the main script: the script builds workers at import time. Put that code "
            f"under {MAIN_GUARD} (worker processes import the main script again)."
        )


# --- worker process ---------------------------------------------------------------------------


def _exit_when_parent_dies(lifeline: Connection) -> None:
    """Block on the lifeline; EOF means the parent is gone, so end this process at once (its
    own workers then see their lifelines close in turn)."""
    with contextlib.suppress(EOFError, OSError):
        lifeline.recv_bytes()
    os._exit(1)


def bootstrap(
    target: Callable[..., None],
    index: int,
    connection: Connection,
    lifeline: Connection,
    num_threads: int,
    *args: Any,
) -> None:
    """Entry point of every worker process: set the process up, then run `target`.

    Ctrl-C is left to the parent, which closes its workers; torch gets `num_threads` threads so
    that workers do not oversubscribe the cores; workers this one starts come from the fork
    server it came from (rlcollect.runtime.fork_server).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    share_parent_fork_server()
    torch.set_num_threads(num_threads)
    # Forked from one server, every worker would draw the same random numbers: start each
    # from fresh entropy (a seed sent later makes them reproducible).
    torch.seed()
    watchdog = threading.Thread(target=_exit_when_parent_dies, args=(lifeline,), daemon=True)
    watchdog.start()
    target(index, connection, *args)


# --- parent side ------------------------------------------------------------------------------


def readiness_probe(connection: Connection) -> Callable[[float], bool]:
    """A function telling whether `connection` has a reply (or EOF) within `timeout` seconds.

    One `poll(2)` on a poller made once: `Connection.poll` builds a selector per call, which
    costs more than the rest of a step's protocol.
    """
    if not hasattr(select, "poll"):
        return connection.poll
    poller = select.poll()
    poller.register(connection.fileno(), select.POLLIN)
    return lambda timeout: bool(poller.poll(timeout * 1000.0))


def exit_description(code: int | None) -> str:
    """`exit code 3`, or `signal SIGKILL` for a process ended by a signal."""
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


class WorkerHandle:
    """The parent's end of one worker: its process and pipes, with failure detection.

    Args:
        index: the worker's index among its siblings (used in error messages).
        context: the multiprocessing context that starts the process.
        target: a module-level function `target(index, connection, *args)` that serves.
        args: further arguments of `target` (pickled by multiprocessing, so shared-memory
            tensors travel as handles).

    Keyword Args:
        name: the process name.
        daemon: daemonic workers end with their parent but may not start processes.
        num_threads: torch threads in the worker.
        describe: turns a message into the call it stands for, for error messages.
    """

    def __init__(
        self,
        index: int,
        context: BaseContext,
        target: Callable[..., None],
        args: Sequence[Any] = (),
        *,
        name: str,
        daemon: bool = True,
        num_threads: int = 1,
        describe: Callable[[bytes], str] = repr,
    ) -> None:
        refuse_while_importing_main(name)
        exit_promptly_on_interrupt()
        self.index = index
        self.describe = describe
        parent_end, child_end = context.Pipe(duplex=True)
        lifeline_reader, self._lifeline = context.Pipe(duplex=False)
        self.process = context.Process(  # type: ignore[attr-defined]
            target=bootstrap,
            args=(target, index, child_end, lifeline_reader, num_threads, *args),
            name=name,
            daemon=daemon,
        )
        self.process.start()
        self.last_message = b""
        # Only the child may hold these ends, so the parent reads EOF as soon as the child dies.
        child_end.close()
        lifeline_reader.close()
        self.connection = parent_end
        self._is_readable = readiness_probe(parent_end)

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self.process.pid  # type: ignore[no-any-return]

    def send(self, message: bytes) -> None:
        """Send one command; a broken pipe is reported as the worker's death."""
        self.last_message = message
        try:
            self.connection.send_bytes(message)
        except OSError as err:
            raise self.death_error() from err

    def poll(self, timeout: float) -> bool:
        """Whether a reply (or the worker's death) is ready within `timeout` seconds."""
        return self._is_readable(timeout)

    def receive(self, timeout: float | None = None, limit: float | None = None) -> bytes:
        """Wait for the reply to the oldest unanswered command and return its payload.

        `limit` is the timeout the command was given, for the error (`timeout` is what is left
        of it when several workers are awaited in turn).

        Raises:
            WorkerError: the worker reported an exception (its message and traceback are in
                the error), died, or did not answer within `timeout` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        interval = LIVENESS_INTERVAL if timeout is None else min(LIVENESS_INTERVAL, timeout)
        while not self._is_readable(interval):
            if not self.process.is_alive():
                raise self.death_error()
            if deadline is not None:
                interval = min(LIVENESS_INTERVAL, deadline - time.monotonic())
                if interval <= 0:
                    activity = self.describe(self.last_message)
                    raise WorkerTimeoutError(
                        self.index,
                        f"no answer within {round(limit or timeout or 0.0, 1):g} s to {activity}",
                    )
        try:
            reply = self.connection.recv_bytes()
        except (EOFError, OSError) as err:
            raise self.death_error() from err
        if reply == OK:
            return b""
        if reply[:1] == ERROR:
            message, remote_traceback, below, raised = pickle.loads(reply[1:])
            raise WorkerRaisedError((self.index, *below), message, remote_traceback, raised)
        return reply[1:]

    def death_error(self) -> WorkerError:
        """The error for a worker process that is gone, with how it ended and its last command."""
        self.process.join(timeout=1.0)
        ending = exit_description(self.process.exitcode)
        if not self.last_message:
            return WorkerError(
                self.index,
                f"the worker process died ({ending}) while starting. If its own output above "
                f"says it re-ran your script, build workers under {MAIN_GUARD} (worker "
                "processes import the main script again).",
            )
        activity = self.describe(self.last_message)
        return WorkerError(
            self.index,
            f"the worker process died ({ending}) during {activity}; code that crashes the "
            "interpreter (os._exit, a signal, a segfault) ends its worker.",
        )

    def request_close(self, message: bytes) -> None:
        """Send the close command `message` if the worker lives (no answer is awaited)."""
        if self.process.is_alive():
            with contextlib.suppress(OSError):
                self.connection.send_bytes(message)

    def finish(self, timeout: float) -> None:
        """Wait for the worker to exit, end it if it does not in time, release its handles."""
        process = self.process
        process.join(timeout)
        if process.is_alive():
            process.terminate()
            process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()
        self.connection.close()
        self._lifeline.close()
        process.close()


def workers_finalizer(
    owner: object, workers: list[WorkerHandle], close_message: bytes, timeout: float
) -> weakref.finalize:
    """`shut_down_workers(workers, ...)` once: when called, when `owner` is garbage, or when
    the process ends. The end of the process includes multiprocessing's: a process that
    multiprocessing started (a `spawn` child running a user's function) joins every child
    that is not a daemon before its `atexit` handlers run, and our workers are not daemons
    (they may start processes), so they must be told to close before that join, or it waits
    for them forever."""
    finalizer = weakref.finalize(owner, shut_down_workers, workers, close_message, timeout)
    # Run by multiprocessing's exit function before it joins the children (priority >= 0).
    multiprocessing.util.Finalize(owner, finalizer, exitpriority=WORKERS_EXIT_PRIORITY)
    return finalizer


def shut_down_workers(workers: list[WorkerHandle], close_message: bytes, timeout: float) -> None:
    """Ask every worker of `workers` to close, wait for them all (together at most `timeout`
    seconds before the rest are terminated) and empty the list, so a second call does
    nothing."""
    for worker in workers:
        worker.request_close(close_message)
    deadline = time.monotonic() + timeout
    while workers:
        workers.pop().finish(max(0.05, deadline - time.monotonic()))

"""The worker side of `ParallelEnv`: the process loop, its command protocol and the parent's handle.

One worker process holds one sub-env bound to its slice of the shared-memory carrier. The
parent talks to it through a pipe with tiny byte messages: a 9-byte header (command, integer
argument such as the time index or a seed) and, for the rare control commands, a payload.
The worker answers every command with one status byte (`OK` or `ERROR`) and, where the command
returns something, a payload. Step results never cross the pipe: they are in shared memory.
"""

from __future__ import annotations

import contextlib
import enum
import pickle
import select
import signal
import struct
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any

import numpy as np
import torch

from rlcollect.envs.base import EnvBase
from rlcollect.errors import WorkerError

HEADER = struct.Struct("<Bq")
SEED_REPLY = struct.Struct("<q")
OK = b"\x00"
ERROR = b"\x01"
# How often a waiting parent checks that a silent worker is still alive (seconds).
LIVENESS_INTERVAL = 0.5


class Command(enum.IntEnum):
    """What the parent asks a worker to do; the header's argument is `t` or a seed."""

    STEP = 1
    ADVANCE = 2
    STEP_AND_ADVANCE = 3
    RESET = 4
    SEED = 5
    BIND = 6
    CLOSE = 7


def encode(command: Command, argument: int = 0, payload: bytes = b"") -> bytes:
    """The message for `command`: header, then the payload (if any)."""
    return HEADER.pack(command, argument) + payload


def describe_command(message: bytes) -> str:
    """The env call a message stands for, e.g. `step_and_advance_into(t=3)`, for error messages."""
    command, argument = HEADER.unpack_from(message)
    name = Command(command).name.lower()
    if command == Command.SEED:
        return f"set_seed({argument})"
    if command in (Command.BIND, Command.CLOSE):
        return name
    return f"{name}_into(t={argument})"


# --- worker process ---------------------------------------------------------------------------


def run_worker(index: int, connection: Connection, factory_bytes: bytes) -> None:
    """Entry point of a worker process: build the sub-env, report its description, serve.

    Ctrl-C is left to the parent, which closes the workers; a worker whose parent is gone
    (its pipe closed) closes its env and exits.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    try:
        env = pickle.loads(factory_bytes)()
        description = pickle.dumps(describe(env))
    except BaseException as err:  # sys.exit() in a factory is reported like any error
        connection.send_bytes(error_reply(err, "creating the sub-env"))
        return
    connection.send_bytes(OK + description)
    try:
        serve(env, connection)
    finally:
        env.close()


def describe(env: EnvBase) -> dict[str, Any]:
    """What the parent needs to know of the sub-env: batch size, device and specs."""
    return {
        "batch_size": env.batch_size,
        "device": env.device,
        "observation_spec": env.observation_spec,
        "action_spec": env.action_spec,
        "reward_spec": env.reward_spec,
        "done_spec": env.done_spec,
    }


def serve(env: EnvBase, connection: Connection) -> None:
    """Answer the parent's commands until `CLOSE` or until the parent's pipe closes."""
    hot: dict[int, Callable[[int], None]] = {
        Command.STEP_AND_ADVANCE: env.step_and_advance_into,
        Command.STEP: env.step_into,
        Command.ADVANCE: env.advance_into,
    }
    while True:
        try:
            message = connection.recv_bytes()
        except (EOFError, OSError):
            return
        command, argument = HEADER.unpack_from(message)
        if command == Command.CLOSE:
            connection.send_bytes(OK)
            return
        try:
            call = hot.get(command)
            if call is not None:
                call(argument)
                reply = OK
            else:
                reply = OK + run_control(env, command, argument, message[HEADER.size :])
        except BaseException as err:  # SystemExit / KeyboardInterrupt from a sub-env too
            reply = error_reply(err, describe_command(message))
        connection.send_bytes(reply)


def run_control(env: EnvBase, command: int, argument: int, payload: bytes) -> bytes:
    """Run one of the rare commands (reset, seed, bind); returns the reply payload."""
    if command == Command.RESET:
        mask = None
        if payload:
            flags = np.frombuffer(payload, dtype=np.bool_).copy()
            mask = torch.from_numpy(flags).reshape(env.batch_size)
        env.reset_into(argument, mask)
        return b""
    if command == Command.SEED:
        return SEED_REPLY.pack(env.set_seed(argument))
    if command == Command.BIND:
        env.bind(pickle.loads(payload))
        return b""
    raise ValueError(f"unknown command {command}; parent and worker versions differ.")


def error_reply(err: BaseException, context: str) -> bytes:
    """The `ERROR` reply carrying the exception's message and the worker's traceback."""
    message = f"{context} raised {type(err).__name__}: {err}"
    return ERROR + pickle.dumps((message, traceback.format_exc()))


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


class WorkerHandle:
    """The parent's end of one worker: its process and pipe, with failure detection.

    Args:
        index: the worker's index in the batch.
        context: the multiprocessing context that starts the process.
        factory_bytes: the cloudpickled zero-argument callable that builds the sub-env.
    """

    def __init__(self, index: int, context: BaseContext, factory_bytes: bytes) -> None:
        self.index = index
        parent_end, child_end = context.Pipe(duplex=True)
        self.process = context.Process(  # type: ignore[attr-defined]
            target=run_worker,
            args=(index, child_end, factory_bytes),
            name=f"rlcollect-env-worker-{index}",
            daemon=True,
        )
        self.process.start()
        self.last_message = b""
        # Only the child may hold this end, so the parent reads EOF as soon as the child dies.
        child_end.close()
        self.connection = parent_end
        self._is_readable = readiness_probe(parent_end)

    def send(self, message: bytes) -> None:
        """Send one command; a broken pipe is reported as the worker's death."""
        self.last_message = message
        try:
            self.connection.send_bytes(message)
        except OSError as err:
            raise self.death_error() from err

    def receive(self, timeout: float | None = None) -> bytes:
        """Wait for the reply to the last command and return its payload.

        Raises:
            WorkerError: the worker reported an exception (its message and traceback are in
                the error), died, or did not answer within `timeout` seconds.
        """
        waited = 0.0
        while not self._is_readable(LIVENESS_INTERVAL):
            if not self.process.is_alive():
                raise self.death_error()
            waited += LIVENESS_INTERVAL
            if timeout is not None and waited >= timeout:
                raise WorkerError(self.index, f"no answer within {timeout:.0f} s")
        try:
            reply = self.connection.recv_bytes()
        except (EOFError, OSError) as err:
            raise self.death_error() from err
        if reply == OK:
            return b""
        if reply[:1] == ERROR:
            message, remote_traceback = pickle.loads(reply[1:])
            raise WorkerError(self.index, message, remote_traceback)
        return reply[1:]

    def death_error(self) -> WorkerError:
        """The error for a worker process that is gone, with its exit code and last command."""
        self.process.join(timeout=1.0)
        code = self.process.exitcode
        activity = describe_command(self.last_message) if self.last_message else "starting"
        return WorkerError(
            self.index,
            f"the worker process died (exit code {code}) during {activity}; a sub-env that "
            "crashes the interpreter (os._exit, a signal, a segfault) ends its worker.",
        )

    def request_close(self) -> None:
        """Ask the worker to close its env and exit (no answer is awaited)."""
        if self.process.is_alive():
            with contextlib.suppress(OSError):
                self.connection.send_bytes(encode(Command.CLOSE))

    def finish(self, timeout: float) -> None:
        """Wait for the worker to exit, kill it if it does not in time, release its handles."""
        process = self.process
        process.join(timeout)
        if process.is_alive():
            process.terminate()
            process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()
        self.connection.close()
        process.close()


def shut_down_workers(workers: list[WorkerHandle], timeout: float = 5.0) -> None:
    """Close every worker of `workers` and empty the list (so a second call does nothing)."""
    for worker in workers:
        worker.request_close()
    while workers:
        workers.pop().finish(timeout)

"""Where the serving loop runs: a thread of the collector's process, or a server process.

`ThreadServer` keeps the policy in this process (one copy, on its device; the workers never
hold it). `ProcessServer` runs the loop in a worker process of `rlcollect.runtime` (started
from the fork server, with a lifeline, its errors reported with their traceback); it builds
the policy there from a factory (or a pickled policy) and takes weights over its command pipe.
Both answer `update(weights, version)` only once the weights are in use.
"""

from __future__ import annotations

import copy
import enum
import functools
import os
import pickle
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import torch
from tensordict import TensorDict, TensorDictBase

from rlcollect.collectors.batched.probe import Probe, build_served_policy
from rlcollect.collectors.batched.serving import (
    Batching,
    PolicyCall,
    ServingLoop,
    stop_loop,
)
from rlcollect.collectors.batched.slots import SlotLayout
from rlcollect.runtime.processes import (
    HEADER,
    OK,
    WorkerHandle,
    command_describer,
    encode,
    error_reply,
    shut_down_workers,
    threads_beside,
    worker_context,
)

# Seconds a closing server gets before it is terminated.
CLOSE_TIMEOUT = 5.0


class ServerCommand(enum.IntEnum):
    """What the collector asks a server process (the header's argument: a policy version)."""

    UPDATE_WEIGHTS = 1
    STATS = 2
    CLOSE = 3


describe_server_command = command_describer(
    ServerCommand, {ServerCommand.UPDATE_WEIGHTS: "update_policy_weights_ (version {argument})"}
)


@dataclass
class ServedPolicy:
    """What a server needs to serve: the policy (or its factory), its keys and placement."""

    policy: Any
    is_factory: bool
    request_keys: list[Any]
    response_keys: list[Any]
    device: torch.device | None
    exploration_type: Any
    batching: Batching
    policy_version: int
    has_version: bool

    @classmethod
    def of(cls, probe: Probe, policy_factory: Callable[[], Any] | None, **how: Any) -> ServedPolicy:
        """What to serve: a private copy of the probed policy (the trainer's module is never
        served), or the factory, called where the server runs."""
        if policy_factory is None:
            policy, is_factory = copy.deepcopy(probe.policy), False
        else:
            policy = functools.partial(build_served_policy, policy_factory, probe.observation_keys)
            is_factory = True
        return cls(
            policy=policy,
            is_factory=is_factory,
            request_keys=[entry[0] for entry in probe.requests],
            response_keys=[entry[0] for entry in probe.responses],
            **how,
        )

    def loop(self, layout: SlotLayout) -> ServingLoop:
        """The serving loop over `layout`, with the policy built (from the factory) and moved
        to its device."""
        policy = self.policy() if self.is_factory else self.policy
        if self.device is not None and isinstance(policy, torch.nn.Module):
            policy = policy.to(self.device)
        call = PolicyCall(
            policy, self.request_keys, self.response_keys, self.device, self.exploration_type
        )
        return ServingLoop(layout, call, self.batching, self.policy_version, self.has_version)


class ThreadServer:
    """The serving loop in a daemon thread of this process.

    Args:
        served: the policy (a private copy: the trainer's module is never served) and how.
        layout: the slots.
    """

    kind = "thread"

    def __init__(self, served: ServedPolicy, layout: SlotLayout) -> None:
        self.layout = layout
        self.loop = served.loop(layout)
        self.error: str | None = None
        self._thread = threading.Thread(
            target=self._serve, name="rlcollect-inference-server", daemon=True
        )
        self._thread.start()

    def _serve(self) -> None:
        try:
            self.loop.run()
        except BaseException as err:  # the loop itself broke: every waiting worker is told
            self.error = f"{type(err).__name__}: {err}\n{traceback.format_exc()}"
            self.loop.fail_all_waiting()

    @property
    def pid(self) -> int:
        return os.getpid()

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def failure(self) -> str | None:
        """Why the server failed (its traceback), or None."""
        return self.error or self.loop.stats.failure

    def stats(self) -> dict[str, Any]:
        return self.loop.stats.as_dict(self.loop.policy_version)

    def update(self, weights: TensorDictBase, version: int) -> None:
        self.loop.load_weights(weights, version)

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        if self._thread.is_alive():
            stop_loop(self.layout)
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()


def run_server_process(index: int, connection: Connection, served_bytes: bytes) -> None:
    """Entry point of a server process: build the loop, say READY, then serve and answer
    commands until CLOSE."""
    del index
    try:
        served, layout = cloudpickle.loads(served_bytes)
        loop = served.loop(layout)
    except Exception as err:
        connection.send_bytes(error_reply(err, "starting the inference server"))
        return
    connection.send_bytes(OK)
    loop.run(lambda: _answer_command(loop, connection), connection.fileno())
    loop.close()


def _answer_command(loop: ServingLoop, connection: Connection) -> bool:
    """Answer one command of the collector; False on CLOSE (or a closed pipe)."""
    try:
        message = connection.recv_bytes()
    except (EOFError, OSError):
        return False
    command, argument = HEADER.unpack_from(message)
    if command == ServerCommand.CLOSE:
        return False
    try:
        if command == ServerCommand.UPDATE_WEIGHTS:
            weights = TensorDict(pickle.loads(message[HEADER.size :])).unflatten_keys(".")
            loop.load_weights(weights, argument)
            connection.send_bytes(OK)
        elif command == ServerCommand.STATS:
            stats = loop.stats.as_dict(loop.policy_version)
            connection.send_bytes(OK + pickle.dumps(stats))
    except Exception as err:
        connection.send_bytes(error_reply(err, describe_server_command(message)))
    return True


def server_threads(layout: SlotLayout) -> int:
    """Torch threads of a server process: the cores the env workers leave (at least one), as a
    multi-process collector's own process gets, whatever this process has set for itself. On
    2 cores, one thread beside 2 to 16 pixel-env workers served 20-30% more frames/s than torch's
    default of two (benchmarks/batched_inference.py)."""
    return threads_beside(layout.rows // layout.envs_per_worker)


class ProcessServer:
    """The serving loop in a server process of its own.

    Args:
        served: the policy or its factory (sent with cloudpickle), and how to serve.
        layout: the slots.
        mp_start_method: how the process starts (default: the fork server).
        startup_timeout: seconds it may take to build the policy.
    """

    kind = "process"

    def __init__(
        self,
        served: ServedPolicy,
        layout: SlotLayout,
        mp_start_method: str | None = None,
        startup_timeout: float = 300.0,
    ) -> None:
        self.layout = layout
        self._handles: list[WorkerHandle] = []
        self._handle = WorkerHandle(
            0,
            worker_context(mp_start_method),
            run_server_process,
            (cloudpickle.dumps((served, layout)),),
            name="rlcollect-inference-server",
            num_threads=server_threads(layout),
            describe=describe_server_command,
        )
        self._handles.append(self._handle)
        self._lock = threading.Lock()
        self._last_stats: dict[str, Any] = {}
        try:
            self._handle.receive(startup_timeout)
        except BaseException:
            self.close()
            raise

    @property
    def _process(self) -> Any:
        """The server's process (TorchRL's attribute name)."""
        return self._handle.process

    @property
    def pid(self) -> int:
        return self._handle.pid

    @property
    def is_alive(self) -> bool:
        return bool(self._handles) and self._handle.process.is_alive()

    def _request(self, command: ServerCommand, argument: int = 0, payload: bytes = b"") -> bytes:
        with self._lock:
            self._handle.send(encode(command, argument, payload))
            return self._handle.receive()

    def failure(self) -> str | None:
        """Why the server failed (dead, or its policy raised: with the traceback), or None."""
        if not self.is_alive:
            return self._handle.death_error().reason if self._handles else "it was shut down"
        try:
            stats = self.stats()
        except Exception as err:
            return str(err)
        return stats.get("failure")

    def stats(self) -> dict[str, Any]:
        """The server's counts (its last ones, once it is gone)."""
        if self.is_alive:
            self._last_stats = pickle.loads(self._request(ServerCommand.STATS))
        return dict(self._last_stats)

    def update(self, weights: TensorDictBase, version: int) -> None:
        flat = {key: value.detach().cpu() for key, value in weights.flatten_keys(".").items()}
        self._request(ServerCommand.UPDATE_WEIGHTS, version, pickle.dumps(flat))

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        if self.is_alive:
            try:
                self._last_stats = pickle.loads(self._request(ServerCommand.STATS))
            except Exception:  # a failing server is being closed anyway
                self._last_stats = self._last_stats or {}
        shut_down_workers(self._handles, encode(ServerCommand.CLOSE), timeout)


def start_server(
    kind: str, served: ServedPolicy, layout: SlotLayout, mp_start_method: str | None
) -> ThreadServer | ProcessServer:
    """A server of `kind` ("thread" or "process") serving `served` over `layout`, started."""
    if kind == "process":
        return ProcessServer(served, layout, mp_start_method)
    return ThreadServer(served, layout)

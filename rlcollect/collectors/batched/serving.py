"""The serving loop of an inference server: gather requests, run the policy once, answer all.

The loop reads request records from the request FIFO, holds them until their rows reach
`min_batch_size` (or `timeout` seconds pass since the first), runs the policy on at most
`max_batch_size` rows at a time, writes the answers and the policy version into the response
rows and signals each worker. It is the same whether it runs in a thread of the collector's
process or in a server process of its own (`server.py`).

With `concurrent_forwards` above one, that many threads take turns at the intake (one at a
time reads the FIFO and picks the next batch) and run their forwards at the same time: on a
CPU, a small batch's forward leaves cores idle that a second forward can use.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, set_interaction_type

from rlcollect.collectors.batched.slots import (
    ANSWERED,
    FAILED,
    REQUEST,
    RESPONSE,
    STOP_WORKER,
    SlotLayout,
    open_fifo,
)
from rlcollect.keys import NestedName

# Index tensors of sets of workers kept for reuse, at most.
MAX_CACHED_INDICES = 4096
# Bytes read from the request FIFO at once (a multiple of a record).
READ_SIZE = REQUEST.size * 4096


@dataclass(frozen=True)
class Batching:
    """How the server batches: rows per forward at most, rows it waits for, and how long."""

    max_batch_size: int = 64
    min_batch_size: int = 1
    timeout: float = 0.01
    concurrent_forwards: int = 1


@dataclass
class ServerStats:
    """What the server counted: requests, forwards, rows, and the last failure."""

    requests: int = 0
    batches: int = 0
    rows: int = 0
    failure: str | None = None  # the policy's last exception, with its traceback
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self, policy_version: int) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "batches": self.batches,
            "rows": self.rows,
            "avg_batch_size": self.rows / self.batches if self.batches else 0.0,
            "policy_version": policy_version,
            "failure": self.failure,
            "torch_threads": torch.get_num_threads(),  # of the process the server runs in
        }


class SharedInteraction:
    """`set_interaction_type` for forwards that may overlap in several threads.

    TensorDict keeps the interaction type per process, not per thread: two overlapping
    `with set_interaction_type(...)` blocks would restore it under each other's forward. The
    first forward in sets it and the last one out restores it.
    """

    def __init__(self, kind: Any) -> None:
        self._context = set_interaction_type(kind)
        self._lock = threading.Lock()
        self._inside = 0

    def __enter__(self) -> None:
        with self._lock:
            if self._inside == 0:
                self._context.__enter__()
            self._inside += 1

    def __exit__(self, *error: object) -> None:
        with self._lock:
            self._inside -= 1
            if self._inside == 0:
                self._context.__exit__(None, None, None)


class PolicyCall:
    """`policy` on a batch of request rows, returning the response entries it produced.

    A `TensorDictModule` around a plain module is called on the tensors (its keys resolved
    once); anything else is called on a TensorDict of the rows.
    """

    def __init__(
        self,
        policy: Any,
        request_keys: list[NestedName],
        response_keys: list[NestedName],
        device: torch.device | None,
        exploration_type: Any,
    ) -> None:
        self.policy = policy
        self.request_keys = request_keys
        self.response_keys = response_keys
        self.device = device
        self._interaction = SharedInteraction(exploration_type)
        self._direct = (
            isinstance(policy, TensorDictModule)
            and type(policy).forward is TensorDictModule.forward
            and list(policy.in_keys) == request_keys[: len(policy.in_keys)]
            and list(policy.out_keys) == response_keys[: len(policy.out_keys)]
        )

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.device is not None:
            inputs = [tensor.to(self.device, non_blocking=True) for tensor in inputs]
        with torch.no_grad(), self._interaction:
            if self._direct:
                module = self.policy.module
                outputs = module(*inputs[: len(self.policy.in_keys)])
                return list(outputs) if isinstance(outputs, tuple) else [outputs]
            rows = inputs[0].shape[0]
            batch = TensorDict(dict(zip(self.request_keys, inputs, strict=True)), [rows])
            result = self.policy(batch)
            result = batch if result is None else result
            return [result.get(key) for key in self.response_keys]


class ServingLoop:
    """Answers the requests of a collector's workers until told to stop.

    Args:
        layout: the slots.
        call: the policy on request rows.
        batching: the batch bounds.
        policy_version: the version written with every answer at first.
        has_version: whether the last response field is the policy version.
    """

    def __init__(
        self,
        layout: SlotLayout,
        call: PolicyCall,
        batching: Batching,
        policy_version: int,
        has_version: bool,
    ) -> None:
        self.layout = layout
        self.call = call
        self.batching = batching
        self.policy_version = policy_version
        self.stats = ServerStats()
        # One per serving thread, held around its forwards: weights change only while every
        # one is free. The intake lock is held by the thread picking the next batch.
        self._forward_locks = [threading.Lock() for _ in range(batching.concurrent_forwards)]
        self._intake = threading.Lock()
        self._thread_errors: list[BaseException] = []
        tables = layout.map()
        self._block = tables.block
        self._requests = [tables.requests.get(field.key) for field in layout.requests]
        responses = [tables.responses.get(field.key) for field in layout.responses]
        self._versions = responses[-1] if has_version else None
        self._responses = responses[:-1] if has_version else responses
        self.request_fd = open_fifo(layout.request_path)
        self._response_fds = [
            open_fifo(layout.response_path(worker)) for worker in range(layout.num_workers)
        ]
        self._pending: list[tuple[int, int]] = []
        self._indices: dict[tuple[int, ...], torch.Tensor] = {}
        self._stopping = False

    # --- requests ---------------------------------------------------------------------------

    def take_requests(self) -> None:
        """Read every request record waiting in the FIFO (call when it is readable)."""
        data = os.read(self.request_fd, READ_SIZE)
        for worker, tag in REQUEST.iter_unpack(data):
            if worker == STOP_WORKER:
                self._stopping = True
            elif worker < len(self._response_fds):
                self._pending.append((worker, tag))

    def _fill_to_minimum(self) -> None:
        """Wait (at most `timeout` seconds) until the pending rows reach `min_batch_size`."""
        need = self.batching.min_batch_size
        per_worker = self.layout.envs_per_worker
        deadline = time.monotonic() + self.batching.timeout
        poller = select.poll()
        poller.register(self.request_fd, select.POLLIN)
        while len(self._pending) * per_worker < need and not self._stopping:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000.0):
                return
            self.take_requests()

    # --- serving ----------------------------------------------------------------------------

    def next_batch(
        self, poller: select.poll, on_control: Callable[[], bool] | None
    ) -> list[tuple[int, int]] | None:
        """The next requests to answer together (None once stopping with none waiting): waits
        for one, takes every request already waiting, waits for `min_batch_size` rows if
        asked, and picks at most `max_batch_size` rows. Call with the intake lock held."""
        while True:
            if not self._stopping:
                for fd, _ in poller.poll(0 if self._pending else None):
                    if fd == self.request_fd:
                        self.take_requests()
                    elif on_control is not None and not on_control():
                        self._stopping = True
            if self._pending:
                if self.batching.min_batch_size > 1:
                    self._fill_to_minimum()
                per_worker = self.layout.envs_per_worker
                workers_per_forward = max(1, self.batching.max_batch_size // per_worker)
                chosen = self._pending[:workers_per_forward]
                del self._pending[:workers_per_forward]
                self.stats.requests += len(chosen)
                self.stats.batches += 1
                self.stats.rows += len(chosen) * per_worker
                return chosen
            if self._stopping:
                return None

    def _rows(self, workers: tuple[int, ...]) -> slice | torch.Tensor:
        """The rows of `workers` (sorted): a slice when they are consecutive (the policy then
        reads the request rows in place), else an index tensor, made once per set."""
        per_worker = self.layout.envs_per_worker
        if workers[-1] - workers[0] == len(workers) - 1:
            return slice(workers[0] * per_worker, (workers[-1] + 1) * per_worker)
        rows = self._indices.get(workers)
        if rows is None:
            rows = torch.tensor(
                [w * per_worker + env for w in workers for env in range(per_worker)]
            )
            if len(self._indices) < MAX_CACHED_INDICES:
                self._indices[workers] = rows
        return rows

    def _serve(self, chosen: list[tuple[int, int]], thread: int = 0) -> None:
        chosen.sort()
        rows = self._rows(tuple(worker for worker, _ in chosen))
        status = ANSWERED
        try:
            with self._forward_locks[thread]:
                self._forward(rows)
        except Exception as err:  # the workers are told; the collector raises it
            status = FAILED
            self.stats.failure = (
                f"the policy raised {type(err).__name__}: {err}\n{traceback.format_exc()}"
            )
        for worker, tag in chosen:
            self.answer(worker, tag, status)

    def _forward(self, rows: slice | torch.Tensor) -> None:
        """Run the policy on `rows` of the requests; write its answers and the version."""
        if isinstance(rows, slice):
            outputs = self.call([table[rows] for table in self._requests])
            for table, output in zip(self._responses, outputs, strict=True):
                table[rows].copy_(output.reshape(table[rows].shape))
            if self._versions is not None:
                self._versions[rows].fill_(self.policy_version)
            return
        outputs = self.call([table.index_select(0, rows) for table in self._requests])
        for table, output in zip(self._responses, outputs, strict=True):
            table.index_copy_(0, rows, output.reshape(-1, *table.shape[1:]).to(table))
        if self._versions is not None:
            self._versions.index_fill_(0, rows, self.policy_version)

    def answer(self, worker: int, tag: int, status: int) -> None:
        os.write(self._response_fds[worker], RESPONSE.pack(tag, status))

    def fail_all_waiting(self) -> None:
        """Answer every pending request with a failure (the server is going away)."""
        for worker, tag in self._pending:
            self.answer(worker, tag, FAILED)
        self._pending.clear()

    def run(self, on_control: Callable[[], bool] | None = None, control_fd: int = -1) -> None:
        """Serve until a stop record arrives (or `on_control`, called when `control_fd` is
        readable, returns False), in `concurrent_forwards` threads (this one and helpers).

        Raises:
            BaseException: what broke a serving thread (not the policy: its errors go to the
                workers it was answering), once every thread has stopped.
        """
        poller = select.poll()
        poller.register(self.request_fd, select.POLLIN)
        if control_fd >= 0:
            poller.register(control_fd, select.POLLIN)
        helpers = [
            threading.Thread(
                target=self._serve_turns,
                args=(poller, on_control, thread),
                name=f"rlcollect-inference-forward-{thread}",
                daemon=True,
            )
            for thread in range(1, len(self._forward_locks))
        ]
        for helper in helpers:
            helper.start()
        self._serve_turns(poller, on_control, 0)
        for helper in helpers:
            helper.join()
        self.fail_all_waiting()
        if self._thread_errors:
            raise self._thread_errors[0]

    def _serve_turns(
        self, poller: select.poll, on_control: Callable[[], bool] | None, thread: int
    ) -> None:
        """One serving thread: take a batch at the intake, answer it, again until stopping.
        A thread that breaks stops the others (a stop record wakes the one at the intake)."""
        try:
            while True:
                with self._intake:
                    chosen = self.next_batch(poller, on_control)
                if chosen is None:
                    return
                self._serve(chosen, thread)
        except BaseException as err:
            self._thread_errors.append(err)
            self._stopping = True
            if len(self._forward_locks) > 1:
                stop_loop(self.layout)

    def close(self) -> None:
        """Close the FIFOs and drop this process's mapping of the slots."""
        for fd in (self.request_fd, *self._response_fds):
            os.close(fd)
        self._response_fds = []
        self._requests, self._responses, self._versions = [], [], None
        self._block = torch.empty(0, dtype=torch.uint8)

    # --- weights ----------------------------------------------------------------------------

    def load_weights(self, weights: TensorDictBase, version: int) -> None:
        """Copy `weights` into the served policy between two forwards, as `version`.

        Raises:
            ValueError: weights of other names or shapes than the policy's, naming them.
        """
        target = TensorDict.from_module(self.call.policy)
        check_weights(target, weights)
        with contextlib.ExitStack() as held, torch.no_grad():
            for lock in self._forward_locks:
                held.enter_context(lock)
            target.update_(weights)
            self.policy_version = version


def check_weights(target: TensorDictBase, weights: TensorDictBase) -> None:
    """Refuse weights whose names or shapes differ from the policy's, naming the first."""
    expected = set(target.keys(include_nested=True, leaves_only=True))
    given = set(weights.keys(include_nested=True, leaves_only=True))
    if expected != given:
        missing = sorted(map(str, expected - given))[:3]
        extra = sorted(map(str, given - expected))[:3]
        raise ValueError(
            f"the weights do not fit the served policy: missing {missing}, unexpected "
            f"{extra}. Pass the policy module itself, its state_dict() or "
            "TensorDict.from_module(policy)."
        )
    for key in expected:
        if target.get(key).shape != weights.get(key).shape:
            raise ValueError(
                f"the weights of {key!r} have shape {list(weights.get(key).shape)}; the "
                f"served policy's have {list(target.get(key).shape)}."
            )


def stop_loop(layout: SlotLayout) -> None:
    """Ask the serving loop over `layout` to return (from any process)."""
    fd = open_fifo(layout.request_path)
    try:
        os.write(fd, REQUEST.pack(STOP_WORKER, 0))
    finally:
        os.close(fd)

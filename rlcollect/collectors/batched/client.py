"""The policy an env worker runs: a client that asks the inference server for its actions.

Inside each worker process runs an ordinary `Collector` (the one rollout loop); its policy is a
`TensorDictModule` around `ServerClient`, whose forward writes the observations into the
worker's request rows, signals the server, waits for its answer and returns the response rows.
So the worker's batches carry everything the loop writes (trajectory ids, done flags, step
counts) and, as policy outputs, what the server answered with the version that answered it.
"""

from __future__ import annotations

import os
import random
import select
from dataclasses import dataclass

import torch
from tensordict.nn import TensorDictModule
from torch import nn

from rlcollect.collectors.batched.slots import (
    FAILED,
    REQUEST,
    RESPONSE,
    SlotLayout,
    open_fifo,
)

# How often a waiting client checks that the server still runs (seconds).
LIVENESS_INTERVAL = 0.5


class InferenceServerError(RuntimeError):
    """The inference server died, or failed to answer a request."""


class ServerClient(nn.Module):
    """`forward(*observations) -> (*outputs)`: one request to the server for one worker's rows.

    Args:
        layout: the slots' layout.
        worker: this worker's index (its rows and response FIFO).
        server_pid: the process that serves (this collector's parent for a thread server):
            its death ends a wait at once instead of hanging.
    """

    def __init__(self, layout: SlotLayout, worker: int, server_pid: int) -> None:
        super().__init__()
        self.worker = worker
        self.server_pid = server_pid
        rows = slice(worker * layout.envs_per_worker, (worker + 1) * layout.envs_per_worker)
        tables = layout.map()
        self._block = tables.block
        self._requests = [tables.requests.get(field.key)[rows] for field in layout.requests]
        self._responses = [tables.responses.get(field.key)[rows] for field in layout.responses]
        self._request_shapes = [field.shape for field in layout.requests]
        self._response_shapes = [field.shape for field in layout.responses]
        self._request_fd = open_fifo(layout.request_path)
        self._response_fd = open_fifo(layout.response_path(worker))
        self._server = os.pidfd_open(server_pid)
        self._poller = select.poll()
        self._poller.register(self._response_fd, select.POLLIN)
        self._poller.register(self._server, select.POLLIN)
        # A fresh worker starts its tags elsewhere than the one it replaces, so that an answer
        # meant for a dead predecessor is never taken for its own.
        self._tag = random.randrange(1 << 16)

    def forward(self, *observations: torch.Tensor) -> tuple[torch.Tensor, ...]:
        batch_shape = observations[0].shape[: observations[0].dim() - len(self._request_shapes[0])]
        for slot, observation in zip(self._requests, observations, strict=True):
            slot.copy_(observation.reshape(slot.shape))
        self._tag = (self._tag + 1) & 0xFFFF
        os.write(self._request_fd, REQUEST.pack(self.worker, self._tag))
        self._await_answer()
        # Views of the response rows: the loop copies them into its batch before this worker
        # asks again (the only time they change).
        return tuple(
            slot.reshape((*batch_shape, *shape))
            for slot, shape in zip(self._responses, self._response_shapes, strict=True)
        )

    def _await_answer(self) -> None:
        while True:
            events = dict(self._poller.poll(LIVENESS_INTERVAL * 1000.0))
            if self._response_fd in events:
                tag, status = RESPONSE.unpack(os.read(self._response_fd, RESPONSE.size))
                if tag != self._tag:
                    continue  # the answer to a request of the worker this one replaced
                if status == FAILED:
                    raise InferenceServerError(
                        f"the inference server failed to answer worker {self.worker}'s "
                        "request: its policy raised (the collector reports the server's "
                        "traceback)."
                    )
                return
            if self._server in events:
                raise InferenceServerError(
                    f"the inference server died (process {self.server_pid}) while worker "
                    f"{self.worker} waited for its actions."
                )

    def close(self) -> None:
        for fd in (self._request_fd, self._response_fd, self._server):
            os.close(fd)


@dataclass
class ClientFactory:
    """A worker's policy factory (picklable: names and numbers only): the client module in a
    `TensorDictModule` reading the request keys and writing the response keys."""

    layout: SlotLayout
    worker: int
    server_pid: int

    def __call__(self) -> TensorDictModule:
        return TensorDictModule(
            ServerClient(self.layout, self.worker, self.server_pid),
            in_keys=[field.key for field in self.layout.requests],
            out_keys=[field.key for field in self.layout.responses],
        )

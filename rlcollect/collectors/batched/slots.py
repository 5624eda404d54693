"""The request and response slots of an inference server, and the pipes that signal them.

Every env worker owns `envs_per_worker` rows of two tables in one shared-memory block: the
observations it asks about (requests) and what the policy answered (responses, with the
policy version that answered). A worker writes its rows in place, then writes a 4-byte
request record `(worker, tag)` into the server's request FIFO; the server batches the rows
of every pending request, runs the policy once, writes the answers into their rows, and
writes `(tag, status)` into each worker's own response FIFO.

Everything is reached by name (the block's name in /dev/shm, the FIFOs' paths), so what a
worker needs travels with cloudpickle inside its policy factory. The parent creates the
block through `multiprocessing.shared_memory`, whose resource tracker removes it even when
the parent is killed; the other processes map it with `torch.from_file`, untracked.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import struct
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import shared_memory
from pathlib import Path

import torch
from tensordict import TensorDict, TensorDictBase

from rlcollect.keys import NestedName

# (worker, tag): a request; worker STOP_WORKER asks the serving loop to return.
REQUEST = struct.Struct("<HH")
# (tag, status): the answer to the request of that tag.
RESPONSE = struct.Struct("<HH")
STOP_WORKER = 0xFFFF
ANSWERED = 0
FAILED = 1
# Fields start on cache-line boundaries, so two workers never write one line.
ALIGNMENT = 64
SHARED_MEMORY = Path("/dev/shm")


@dataclass(frozen=True)
class Field:
    """One entry of a table: its key, the shape of one row, dtype and byte offset."""

    key: NestedName
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int

    def nbytes(self, rows: int) -> int:
        return rows * math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


def lay_out(
    entries: Sequence[tuple[NestedName, tuple[int, ...], torch.dtype]], rows: int, start: int
) -> tuple[tuple[Field, ...], int]:
    """Fields for `entries` placed one after another from byte `start`; returns them and the
    end of the last."""
    fields = []
    offset = start
    for key, shape, dtype in entries:
        offset = -(-offset // ALIGNMENT) * ALIGNMENT
        field = Field(key, tuple(shape), dtype, offset)
        fields.append(field)
        offset += field.nbytes(rows)
    return tuple(fields), offset


@dataclass(frozen=True)
class SlotLayout:
    """Where every request and response field of every row lives, and the pipes' paths.

    Args:
        name: the shared-memory block's name (a file in /dev/shm).
        rows: rows of each table (all envs of all workers).
        envs_per_worker: rows of one worker (worker w owns rows `w*E .. (w+1)*E - 1`).
        requests: what the policy reads.
        responses: what the policy writes, the policy version included.
        size: the block's size in bytes.
        directory: where the FIFOs are.
    """

    name: str
    rows: int
    envs_per_worker: int
    requests: tuple[Field, ...]
    responses: tuple[Field, ...]
    size: int
    directory: str

    @property
    def request_path(self) -> str:
        return os.path.join(self.directory, "requests")

    def response_path(self, worker: int) -> str:
        return os.path.join(self.directory, f"response-{worker}")

    @property
    def num_workers(self) -> int:
        return self.rows // self.envs_per_worker

    def map(self) -> Tables:
        """The two tables over the shared block, mapped into this process."""
        block = torch.from_file(
            str(SHARED_MEMORY / self.name), shared=True, size=self.size, dtype=torch.uint8
        )
        return Tables(self._table(block, self.requests), self._table(block, self.responses), block)

    def _table(self, block: torch.Tensor, fields: tuple[Field, ...]) -> TensorDictBase:
        table = TensorDict({}, batch_size=[self.rows])
        for field in fields:
            raw = block[field.offset : field.offset + field.nbytes(self.rows)]
            table.set(field.key, raw.view(field.dtype).view(self.rows, *field.shape))
        return table


@dataclass
class Tables:
    """The request and response tables of one process's mapping of the block."""

    requests: TensorDictBase
    responses: TensorDictBase
    block: torch.Tensor


class SharedSlots:
    """The parent's side: creates the block and the FIFOs, and removes them on `close()`.

    Args:
        rows: all envs of all workers.
        envs_per_worker: rows per worker.
        requests: `(key, row shape, dtype)` of what the policy reads.
        responses: `(key, row shape, dtype)` of what it writes (the version included).
    """

    def __init__(
        self,
        rows: int,
        envs_per_worker: int,
        requests: Sequence[tuple[NestedName, tuple[int, ...], torch.dtype]],
        responses: Sequence[tuple[NestedName, tuple[int, ...], torch.dtype]],
    ) -> None:
        request_fields, end = lay_out(requests, rows, 0)
        response_fields, end = lay_out(responses, rows, end)
        size = max(ALIGNMENT, end)
        self._block = shared_memory.SharedMemory(create=True, size=size)
        # The tensors map the file themselves: Python's mapping is not needed.
        self._block.close()
        self.directory = tempfile.mkdtemp(prefix="rlcollect-batched-")
        self.layout = SlotLayout(
            self._block.name,
            rows,
            envs_per_worker,
            request_fields,
            response_fields,
            size,
            self.directory,
        )
        # Mapped here while the collector lives: the block is never an unheld name in
        # /dev/shm (which leak checks would take for a leak).
        self.tables: Tables | None = self.layout.map()
        os.mkfifo(self.layout.request_path)
        for worker in range(self.layout.num_workers):
            os.mkfifo(self.layout.response_path(worker))
        self.closed = False

    def close(self) -> None:
        """Remove the block's name and the FIFOs (mappings still open stay valid)."""
        if self.closed:
            return
        self.closed = True
        self.tables = None
        with contextlib.suppress(FileNotFoundError):
            self._block.unlink()
        shutil.rmtree(self.directory, ignore_errors=True)


def open_fifo(path: str) -> int:
    """A FIFO opened for reading and writing: the open never blocks, whoever comes first."""
    return os.open(path, os.O_RDWR)

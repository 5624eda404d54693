"""Batches and worker-process bodies shared by the replay tests (imported by spawned children)."""

from __future__ import annotations

import os
import signal
from typing import Any

import torch
from tensordict import TensorDict

from rlcollect.replay import LazyMemmapStorage, ReplayBuffer

PAYLOAD = 64  # floats per item in crash tests: big enough that writes take a while


def transitions(num_frames: int, first: int = 0, traj_len: int = 5) -> TensorDict:
    """CartPole-like frames whose entries all derive from a frame id (``first + i``)."""
    ids = torch.arange(first, first + num_frames)
    done = ((ids + 1) % traj_len == 0).unsqueeze(-1)
    return TensorDict(
        {
            "observation": ids.unsqueeze(-1).float().expand(num_frames, 4).clone(),
            "action": torch.nn.functional.one_hot(ids % 2, 2),
            "done": torch.zeros(num_frames, 1, dtype=torch.bool),
            "id": ids,
            "next": {
                "observation": (ids + 1).unsqueeze(-1).float().expand(num_frames, 4).clone(),
                "reward": torch.ones(num_frames, 1),
                "done": done,
                "terminated": done.clone(),
                "truncated": torch.zeros(num_frames, 1, dtype=torch.bool),
            },
            "collector": {"traj_ids": ids // traj_len},
        },
        batch_size=[num_frames],
    )


def payload_batch(first: int, count: int) -> TensorDict:
    """Items whose every entry repeats the item id, so a torn item is easy to spot."""
    ids = torch.arange(first, first + count)
    return TensorDict(
        {
            "id": ids,
            "payload": ids.unsqueeze(-1).double().expand(count, PAYLOAD).clone(),
            "check": -ids,
        },
        batch_size=[count],
    )


def is_consistent(items: TensorDict) -> torch.Tensor:
    """Per item: whether all its entries agree with its id."""
    ids = items["id"]
    same_payload = (items["payload"] == ids.unsqueeze(-1).double()).all(-1)
    return same_payload & (items["check"] == -ids)


def extend_shared(
    buffer: ReplayBuffer, worker: int, items: int, chunk: int, go: Any = None
) -> None:
    """Writes ``items`` transitions with ids ``worker * 10**6 + i`` in chunks of ``chunk``,
    after waiting at the barrier ``go`` when one is given."""
    torch.set_num_threads(1)
    if go is not None:
        go.wait()
    first = worker * 10**6
    for start in range(0, items, chunk):
        count = min(chunk, items - start)
        buffer.extend(transitions(count, first + start))


def extend_until_killed(directory: str, max_size: int, report_path: str, chunk: int) -> None:
    """Extends a memory-mapped buffer forever, reporting the last id of every returned extend."""
    torch.set_num_threads(1)
    buffer = ReplayBuffer(storage=LazyMemmapStorage(max_size, scratch_dir=directory))
    report = os.open(report_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    first = 0
    while True:
        buffer.extend(payload_batch(first, chunk))
        first += chunk
        os.write(report, f"{first - 1}\n".encode())


def die_mid_write(directory: str, max_size: int, count: int, written: int) -> None:
    """Starts writing ``count`` items to a buffer, writes part of them, and kills itself."""
    storage = LazyMemmapStorage(max_size, scratch_dir=directory)
    first = storage.log.write_count
    batch = payload_batch(first, count)
    batch["payload"][written:] = -1.0  # what a torn slot would show: a mix of two items
    with storage.lock:
        frames = storage.prepare(batch, batch_dims=1)
        storage.log.begin(count)
        storage.write(storage.log.cursor, frames.tail(count))
        os.kill(os.getpid(), signal.SIGKILL)

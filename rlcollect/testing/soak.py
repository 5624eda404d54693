"""The checks of a chaos soak (workers killed at random while they fill a shared buffer or hand
out batches), shared by `benchmarks/soak.py` and its short run in the test-suite.

Frames come from `soak_env`: a counting env whose observation is the step since the reset, so a
frame is named by its trajectory id and its step, and a trajectory is whole when its steps run
0, 1, 2, ... without a gap or a repeat.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from rlcollect import keys
from rlcollect.testing.counting import CountingEnv

EPISODE_LENGTH = 25


def soak_env() -> CountingEnv:
    """The soak's env (a maker that worker processes import)."""
    return CountingEnv(episode_length=EPISODE_LENGTH)


class VersionedPolicy(nn.Module):
    """A policy with one weight, for soaks that update the weights every batch."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return ((observation[..., 0] + self.bias) > EPISODE_LENGTH / 2).long()


@dataclass
class BufferAudit:
    """What a buffer holds against what the collector counted."""

    stored: int  # frames in the buffer
    counted: int  # the collector's `frames`
    lost: int  # counted, not in the buffer
    uncounted: int  # in the buffer, not counted
    doubled: int  # frames in the buffer more than once
    broken_trajectories: int  # trajectories whose steps do not run 0, 1, 2, ...

    @property
    def clean(self) -> bool:
        return not (self.lost or self.uncounted or self.doubled or self.broken_trajectories)


def audit_buffer(frames: TensorDictBase, counted: int) -> BufferAudit:
    """Check every frame of `frames` (all the buffer holds) against the collector's count: each
    frame once, each trajectory contiguous from its first step, `counted` equal to what is
    there."""
    ids = frames.get(keys.TRAJ_IDS).flatten().long()
    steps = frames.get(keys.OBSERVATION).flatten().long()
    stored = int(ids.numel())
    order = torch.argsort(ids * (steps.max().item() + 1 if stored else 1) + steps, stable=True)
    ids, steps = ids[order], steps[order]
    repeated = (ids[1:] == ids[:-1]) & (steps[1:] == steps[:-1]) if stored else ids[:0]
    # A frame's position in its trajectory must equal its step.
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[1:] = ids[1:] != ids[:-1]
    first = torch.cummax(torch.where(starts, torch.arange(stored), 0), 0).values
    position = torch.arange(stored) - first
    broken = ids[position != steps].unique().numel()
    return BufferAudit(
        stored=stored,
        counted=counted,
        lost=max(0, counted - stored),
        uncounted=max(0, stored - counted),
        doubled=int(repeated.sum()),
        broken_trajectories=int(broken),
    )


def stale_batches(versions: Iterable[tuple[int, int, int]], synchronous: bool) -> int:
    """Batches that came from weights older than an update acknowledged before them.

    Args:
        versions: per batch, in the order handed out: `(worker, the batch's policy version,
            the version last acknowledged before the batch was handed out)`; worker -1 for a
            gathered batch.
        synchronous: a gathered batch must carry the acknowledged version; a worker of an
            asynchronous collector may hand out one batch it had started before the update.
    """
    stale = 0
    in_flight: dict[int, int] = {}  # worker -> the acknowledged version of its last batch
    for worker, version, acknowledged in versions:
        if synchronous:
            stale += version < acknowledged
            continue
        # A worker's batch may have started before the updates since its last batch (its
        # first batch: before any update).
        allowed = in_flight.get(worker, 0)
        stale += version < min(allowed, acknowledged)
        in_flight[worker] = acknowledged
    return stale


def batch_version(batch: TensorDictBase) -> int:
    """The one policy version of a batch (-1 when its frames disagree: a torn batch)."""
    versions = batch.get(("next", keys.POLICY_VERSION)).unique()
    return int(versions[0]) if versions.numel() == 1 else -1


def processes_left(pids: Iterable[int]) -> list[int]:
    """The pids of `pids` that still run (zombies count as gone)."""
    left = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.append(pid)
    return left


def shared_memory_of_ours(prefix: str) -> set[str]:
    """The entries of /dev/shm this process tree may have made: semaphores with `prefix`
    (set by `name_our_semaphores`) and the shared buffers' directories this process made
    (`rlcollect-rb-<pid>-`; another process's buffers, a test running beside, are not ours)."""
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return set()
    return {
        name
        for name in names
        if name.startswith((f"sem.{prefix}-", f"rlcollect-rb-{os.getpid()}-"))
        and (Path("/dev/shm") / name).exists()
    }


def shared_memory_held() -> set[str]:
    """What this process maps or holds open under /dev/shm (named or unlinked)."""
    held = set()
    with open("/proc/self/maps") as maps:
        held |= {line.split()[-1] for line in maps if "/dev/shm/" in line}
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("/dev/shm/"):
            held.add(target)
    return held


def name_our_semaphores() -> str:
    """Give the semaphores this process tree makes a prefix of their own (multiprocessing's
    `semprefix`), so a leak check tells them from another program's; returns it."""
    import multiprocessing

    prefix = f"mp-rlcsoak{os.getpid()}"
    multiprocessing.current_process()._config["semprefix"] = f"/{prefix}"  # type: ignore[attr-defined]
    return prefix


def worker_pids(stats: Mapping[str, Any], depth: int) -> list[int]:
    """The pids of a collector's workers `depth` levels down in its `stats()` (1: its own)."""
    workers = list(stats.get("per_worker", ()))
    for _ in range(depth - 1):
        workers = [
            child for worker in workers for child in worker["collector"].get("per_worker", ())
        ]
    return [int(worker["pid"]) for worker in workers]

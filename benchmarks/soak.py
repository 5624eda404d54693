"""Chaos soak: multi-process collectors keep every frame while workers are SIGKILLed at random.

For MultiSyncCollector and MultiAsyncCollector with 4 workers (`restart_dead_workers=True`), and
AsyncBatchedCollector over 4 env workers (filling a buffer only):
`start()` fills a shared buffer (memory and memmap storages) while a killer thread SIGKILLs a
random worker (or, in the nested run, a random grandchild) every `--kill-every` seconds; then
`for data in collector` with a weight update every batch, under the same killer. At the end it
checks (with `rlcollect.testing.soak`): every frame in the buffer belongs to a counted batch and
is there once (trajectory id + step), `frames` equals what the buffer holds, every trajectory
runs contiguously from its first step, no batch comes from weights older than an acknowledged
update, and no process or shared-memory entry of ours is left.

    python benchmarks/soak.py                     # 60 s in all, a kill every 0.5 s
    python benchmarks/soak.py --seconds 10 --csv soak.csv --markdown soak.md

Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import csv
import functools
import gc
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from rlcollect.collectors import AsyncBatchedCollector, MultiAsyncCollector, MultiSyncCollector
from rlcollect.replay import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer
from rlcollect.testing.soak import (
    VersionedPolicy,
    audit_buffer,
    batch_version,
    name_our_semaphores,
    processes_left,
    shared_memory_held,
    shared_memory_of_ours,
    soak_env,
    stale_batches,
    worker_pids,
)

NUM_WORKERS = 4
FRAMES_PER_BATCH = 400  # 100 per worker
# Frames a buffer holds: the collectors stop there, so nothing is overwritten and every frame
# collected can be checked.
CAPACITY = 2_000_000
COLLECTORS = {"MultiSync": MultiSyncCollector, "MultiAsync": MultiAsyncCollector}


@dataclass
class SoakRow:
    """One configuration's figures (the table's row)."""

    collector: str
    storage: str
    kills: int
    frames: int
    lost: int
    counted_twice: int
    uncounted: int
    broken_trajectories: int
    stale_batches: int
    leftovers: int

    @property
    def clean(self) -> bool:
        return not (
            self.lost
            or self.counted_twice
            or self.uncounted
            or self.broken_trajectories
            or self.stale_batches
            or self.leftovers
        )


class Killer:
    """A thread that SIGKILLs a random pid of `victims()` every `every` seconds."""

    def __init__(self, victims: Callable[[], list[int]], every: float, seed: int) -> None:
        self.victims = victims
        self.every = every
        self.random = random.Random(seed)
        self.kills = 0
        self.seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-killer", daemon=True)

    def __enter__(self) -> Killer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.victims = list  # drop the collector

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                pids = self.victims()
            except Exception:
                continue
            self.seen.update(pids)
            if not pids:
                continue
            try:
                os.kill(self.random.choice(pids), signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.kills += 1


def make_buffer(storage: str, directory: Path) -> ReplayBuffer:
    if storage == "memory":
        return ReplayBuffer(storage=LazyTensorStorage(CAPACITY), shared=True)
    return ReplayBuffer(
        storage=LazyMemmapStorage(CAPACITY, scratch_dir=directory / "memmap"), shared=True
    )


def victims_of(collector: Any, nested: bool) -> Callable[[], list[int]]:
    """The pids the killer picks from: the workers, or in a nested run the grandchildren
    (AsyncBatchedCollector's: its env workers; its server is a thread here)."""
    if isinstance(collector, AsyncBatchedCollector):
        return collector.process_ids
    if not nested:
        return lambda: list(collector.pool.pids)
    return lambda: worker_pids(collector.stats(), depth=2)


def frames_per_batch(name: str) -> int:
    """A MultiAsync batch is one worker's; a MultiSync batch gathers every worker's."""
    return FRAMES_PER_BATCH // NUM_WORKERS if name == "MultiAsync" else FRAMES_PER_BATCH


def build_filling(name: str, buffer: ReplayBuffer, nested: bool) -> Any:
    """The collector of a background row: 4 workers filling `buffer`, restarting the dead."""
    if name == "AsyncBatched":  # one env per worker, one server batching their policy calls
        return AsyncBatchedCollector(
            [soak_env] * NUM_WORKERS,
            policy=VersionedPolicy(),
            frames_per_batch=FRAMES_PER_BATCH,
            total_frames=CAPACITY,
            replay_buffer=buffer,
            restart_dead_workers=True,
        )
    options: dict[str, Any] = {}
    if nested:
        options["collector_class"] = functools.partial(MultiSyncCollector, num_workers=2)
    return COLLECTORS[name](
        soak_env,
        num_workers=NUM_WORKERS,
        frames_per_batch=frames_per_batch(name),
        total_frames=CAPACITY,
        replay_buffer=buffer,
        restart_dead_workers=True,
        **options,
    )


def leftovers(pids: set[int], prefix: str, shm_before: set[str], held_before: set[str]) -> int:
    """Processes of ours still running, and shared memory of ours still named or held."""
    deadline = time.monotonic() + 10
    while processes_left(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    gc.collect()
    named = shared_memory_of_ours(prefix) - shm_before
    held = shared_memory_held() - held_before
    left = processes_left(pids)
    if left or named or held:
        print(f"left behind: processes {left}, named {sorted(named)}, held {sorted(held)}")
    return len(left) + len(named) + len(held)


def soak_background(
    name: str, storage: str, seconds: float, kill_every: float, nested: bool, prefix: str
) -> SoakRow:
    """`start()` fills a shared buffer while the killer works; then the buffer is audited."""
    shm_before, held_before = shared_memory_of_ours(prefix), shared_memory_held()
    with tempfile.TemporaryDirectory(prefix="rlcollect-soak-") as directory:
        buffer = make_buffer(storage, Path(directory))
        collector = build_filling(name, buffer, nested)
        with Killer(victims_of(collector, nested), kill_every, seed=len(name)) as killer:
            killer.seen.update(collector.process_ids())
            collector.start()
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and not collector.is_done:
                time.sleep(0.05)
        killer.seen.update(collector.process_ids())
        collector.async_shutdown()
        counted = collector.frames
        audit = audit_buffer(buffer[torch.arange(len(buffer))], counted)
        buffer.close()
        del buffer, collector  # their mappings of the buffer go with them
    left = leftovers(killer.seen, prefix, shm_before, held_before)
    return SoakRow(
        collector=name + (" (nested)" if nested else ""),
        storage=storage,
        kills=killer.kills,
        frames=counted,
        lost=audit.lost,
        counted_twice=audit.doubled,
        uncounted=audit.uncounted,
        broken_trajectories=audit.broken_trajectories,
        stale_batches=0,
        leftovers=left,
    )


def soak_iteration(name: str, seconds: float, kill_every: float, prefix: str) -> SoakRow:
    """`for data in collector` with a weight update after every batch, under the killer."""
    shm_before, held_before = shared_memory_of_ours(prefix), shared_memory_held()
    policy = VersionedPolicy()
    collector = COLLECTORS[name](
        soak_env,
        policy,
        num_workers=NUM_WORKERS,
        frames_per_batch=frames_per_batch(name),
        restart_dead_workers=True,
        track_policy_version=True,
    )
    versions: list[tuple[int, int, int]] = []
    frames = 0
    with Killer(victims_of(collector, nested=False), kill_every, seed=len(name)) as killer:
        killer.seen.update(collector.process_ids())
        acknowledged = 0
        deadline = time.monotonic() + seconds
        for data in collector:
            # Worker i of W draws trajectory ids i, i + W, ... (restarted ones too).
            worker = int(data["collector", "traj_ids"].flatten()[0]) % NUM_WORKERS
            worker = worker if name == "MultiAsync" else -1
            versions.append((worker, batch_version(data), acknowledged))
            frames += data.numel()
            if time.monotonic() > deadline:
                break
            with torch.no_grad():
                policy.bias.add_(0.001)
            collector.update_policy_weights_(policy)
            acknowledged = collector.policy_version
    killer.seen.update(collector.process_ids())
    collector.shutdown()
    del collector
    left = leftovers(killer.seen, prefix, shm_before, held_before)
    return SoakRow(
        collector=name,
        storage="batches (weights every batch)",
        kills=killer.kills,
        frames=frames,
        lost=0,
        counted_twice=0,
        uncounted=0,
        broken_trajectories=0,
        stale_batches=stale_batches(versions, synchronous=name == "MultiSync")
        + sum(version == -1 for _, version, _ in versions),
        leftovers=left,
    )


def run_soak(seconds: float, kill_every: float) -> list[SoakRow]:
    """Every configuration, `seconds` in all shared between them."""
    prefix = name_our_semaphores()
    plans: list[Callable[[float], SoakRow]] = []
    for name in COLLECTORS:
        for storage in ("memory", "memmap"):
            plans.append(
                functools.partial(
                    soak_background,
                    name,
                    storage,
                    kill_every=kill_every,
                    nested=False,
                    prefix=prefix,
                )
            )
    for name, nested in (("MultiSync", True), ("AsyncBatched", False)):
        plans.append(
            functools.partial(
                soak_background,
                name,
                "memory",
                kill_every=kill_every,
                nested=nested,
                prefix=prefix,
            )
        )
    for name in COLLECTORS:
        plans.append(functools.partial(soak_iteration, name, kill_every=kill_every, prefix=prefix))
    each = seconds / len(plans)
    return [plan(each) for plan in plans]


HEADER = (
    "collector",
    "storage",
    "kills survived",
    "frames collected",
    "frames lost",
    "frames counted twice",
    "frames uncounted",
    "broken trajectories",
    "stale batches",
    "leftovers",
)


def table_rows(rows: list[SoakRow]) -> list[list[str]]:
    return [[str(value) for value in asdict(row).values()] for row in rows]


def markdown(rows: list[SoakRow]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(rows)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="in all (default 60)")
    parser.add_argument("--kill-every", type=float, default=0.5, help="seconds between kills")
    parser.add_argument("--csv", type=Path, default=None, help="also write the table as CSV")
    parser.add_argument("--markdown", type=Path, default=None, help="also write it as markdown")
    args = parser.parse_args(argv)
    rows = run_soak(args.seconds, args.kill_every)
    print(markdown(rows), end="")
    if args.csv is not None:
        with open(args.csv, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(HEADER)
            writer.writerows(table_rows(rows))
    if args.markdown is not None:
        args.markdown.write_text(markdown(rows))
    failed = [row for row in rows if not row.clean]
    if failed:
        print(f"FAILED: {[row.collector + '/' + row.storage for row in failed]}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared pytest fixtures: leak checks for tests that start worker processes."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SHARED_MEMORY = Path("/dev/shm")
GRACE_SECONDS = 1.0


def shared_memory_entries() -> set[str]:
    """The names in /dev/shm (empty where the platform has none)."""
    try:
        return set(os.listdir(SHARED_MEMORY))
    except OSError:
        return set()


def process_parents() -> dict[int, int]:
    """pid -> parent pid of every live process, read from /proc."""
    parents: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                parents[int(proc.name)] = int(
                    (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
                )
            except (OSError, IndexError, ValueError):
                continue
    return parents


def foreign_processes() -> list[Path]:
    """/proc entries of the live processes that are neither this process nor its descendants."""
    parents = process_parents()
    me, foreign = os.getpid(), []
    for pid in parents:
        ancestor = pid
        while ancestor not in (me, 0, 1) and ancestor in parents:
            ancestor = parents[ancestor]
        if ancestor != me:
            foreign.append(Path("/proc") / str(pid))
    return foreign


def held_elsewhere(names: set[str]) -> set[str]:
    """The entries another engineer's process maps or holds open: not this test's leak."""
    held: set[str] = set()
    for proc in foreign_processes():
        try:
            text = (proc / "maps").read_text()
            text += "\n".join(os.readlink(fd) for fd in (proc / "fd").iterdir())
        except OSError:
            continue
        held |= {name for name in names if f"{SHARED_MEMORY}/{name}" in text}
    return held


def wait_for_children(deadline: float) -> list[multiprocessing.process.BaseProcess]:
    children = multiprocessing.active_children()
    while children and time.monotonic() < deadline:
        time.sleep(0.05)
        children = multiprocessing.active_children()
    return children


@pytest.fixture
def no_leftover_children() -> Iterator[None]:
    """Fail the test if it leaves a child process alive or a new /dev/shm entry behind.

    Children get a short grace period to exit, and are then terminated so that they do not
    leak into later tests. Entries that a process outside this test holds are not counted.
    """
    before = shared_memory_entries()
    yield
    deadline = time.monotonic() + GRACE_SECONDS
    children = wait_for_children(deadline)
    for child in children:
        child.terminate()
        child.join(timeout=5)
    new = shared_memory_entries() - before
    while new and time.monotonic() < deadline:
        time.sleep(0.05)
        new = shared_memory_entries() - before
    leaked = new - held_elsewhere(new)
    if children:
        pytest.fail(f"the test left child processes alive: {children}; shut them down.")
    if leaked:
        pytest.fail(f"the test left shared memory behind in /dev/shm: {sorted(leaked)}.")

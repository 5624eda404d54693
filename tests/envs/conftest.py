"""Process and shared-memory leak checks at the OS level, for the env tests that start workers.

The shared `no_leftover_children` fixture (tests/conftest.py) sees the children that
multiprocessing tracks and the names in /dev/shm. Workers started through the fork server are
children of the fork server, and torch shares tensors through unlinked files that /dev/shm
never lists; the fixture here checks both at the OS level.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import process_parents

# multiprocessing's per-interpreter helpers, children of this process: one fork server (whose
# children are the workers) and one resource tracker, shared by all ParallelEnvs and collectors
# of the process; they are not workers and exit with the interpreter.
MULTIPROCESSING_HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


def descendants() -> dict[int, tuple[int, str]]:
    """This process's live descendants at the OS level (zombies included): pid -> (parent pid,
    command line)."""
    parents = process_parents()
    found: dict[int, tuple[int, str]] = {}
    frontier = [os.getpid()]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                try:
                    command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                except OSError:
                    command = b""
                found[pid] = (ppid, command.decode(errors="replace"))
                frontier.append(pid)
    return found


def leftover_processes(before: dict[int, tuple[int, str]]) -> dict[int, str]:
    """The descendants started since `before`, except multiprocessing's helpers (the workers,
    forked from the fork server, share its command line but not its parent)."""
    me = os.getpid()
    return {
        pid: command
        for pid, (ppid, command) in descendants().items()
        if pid not in before
        and not (ppid == me and any(helper in command for helper in MULTIPROCESSING_HELPERS))
    }


def shared_memory_held() -> int:
    """How many shared-memory files this process maps or holds open (named or unlinked)."""
    held = sum("/dev/shm/" in line for line in Path("/proc/self/maps").read_text().splitlines())
    for fd in Path("/proc/self/fd").iterdir():
        try:
            held += "/dev/shm/" in os.readlink(fd)
        except OSError:
            continue
    return held


@pytest.fixture
def nothing_left_at_os_level() -> Iterator[None]:
    """Fail when the test leaves a descendant process behind (including ones multiprocessing
    no longer tracks: a worker whose handle was dropped, a process a sub-env started) or a
    shared-memory mapping or descriptor (named or unlinked)."""
    gc.collect()
    processes, shared = descendants(), shared_memory_held()
    yield
    gc.collect()
    deadline = time.monotonic() + 5.0
    left = leftover_processes(processes)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = leftover_processes(processes)
    assert not left, f"processes left behind: {left}"
    assert shared_memory_held() <= shared, "shared memory is still mapped or held open"

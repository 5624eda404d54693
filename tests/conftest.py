"""Shared pytest fixtures: leak checks for tests that start worker processes.

`no_leftover_children` sees the children that multiprocessing tracks and the names in
/dev/shm. Workers started through the fork server are children of the fork server, and torch
shares tensors through unlinked files that /dev/shm never lists; `nothing_left_at_os_level`
checks both at the OS level.

Only what our process tree made counts: the machine may be busy with other programs that use
multiprocessing. Semaphores carry this session's name prefix (below), which every process we
start inherits; other entries count when they belong to our user and no foreign process holds
them.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SHARED_MEMORY = Path("/dev/shm")
GRACE_SECONDS = 1.0
SETTLE_SECONDS = 1.0
# The segments tests/test_conftest.py leaks on purpose, in a pytest run of its own, while the
# other xdist worker's tests run: named `<DELIBERATE_LEAK><pid>-...`.
DELIBERATE_LEAK = "rlcdeliberate"

# multiprocessing names a semaphore `<semprefix>-<random>` (file `sem.<semprefix>-<random>`),
# with the prefix every process inherits from the one that started it: giving this session's
# processes a prefix of their own tells their semaphores from another program's.
SEMAPHORE_PREFIX = f"mp-rlctest{os.getpid()}"
multiprocessing.current_process()._config["semprefix"] = f"/{SEMAPHORE_PREFIX}"


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what the run has built by now (torch, Ray and the other modules, the collected
    tests: about 400,000 objects that live as long as the run) out of the garbage collector's
    reach. Every full collection traversed them all, 0.3-0.4 s of CPU each, and the fixtures
    below collect twice per test; what the tests make is collected as before."""
    gc.collect()
    gc.freeze()


def made_by_us(name: str) -> bool:
    """Whether a /dev/shm entry may be ours: a semaphore only with our prefix, anything else
    only when it belongs to our user."""
    if name.startswith("sem."):
        return name.startswith(f"sem.{SEMAPHORE_PREFIX}-")
    if name.startswith(DELIBERATE_LEAK):  # tests/test_conftest.py's: only its own process's
        return name.startswith(f"{DELIBERATE_LEAK}{os.getpid()}-")
    try:
        return (SHARED_MEMORY / name).stat().st_uid == os.getuid()
    except OSError:
        return False


def shared_memory_entries() -> set[str]:
    """The names in /dev/shm that our processes may have made (empty where there is none)."""
    try:
        return {name for name in os.listdir(SHARED_MEMORY) if made_by_us(name)}
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


def shared_memory_left(before: set[str], deadline: float) -> set[str]:
    """The /dev/shm entries made since `before` that are still there at `deadline` and that
    no process outside this test holds."""
    new = shared_memory_entries() - before
    while new and time.monotonic() < deadline:
        time.sleep(0.05)
        new = shared_memory_entries() - before
    leaked = new - held_elsewhere(new)
    # Another program's entry (the other xdist worker's, say) can sit unheld for a moment
    # between its creation and its mapping, or its unmapping and its unlinking: a leak stays.
    settle = time.monotonic() + SETTLE_SECONDS
    while leaked and time.monotonic() < settle:
        time.sleep(0.05)
        leaked = (leaked & shared_memory_entries()) - held_elsewhere(leaked)
    return leaked


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
    leaked = shared_memory_left(before, deadline)
    if children:
        pytest.fail(f"the test left child processes alive: {children}; shut them down.")
    if leaked:
        pytest.fail(f"the test left shared memory behind in /dev/shm: {sorted(leaked)}.")


# multiprocessing's per-interpreter helpers, children of this process: one fork server (whose
# children are the workers) and one resource tracker, shared by all ParallelEnvs and collectors
# of the process; they are not workers and exit with the interpreter.
MULTIPROCESSING_HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")
# The example tests' script zygote (ZYGOTE_MODULE of tests/examples/script_runner.py; named here,
# not imported: tests/test_conftest.py runs this file outside the repository), a child of this
# process that lives as long as it does; the script runs it forks are checked like any other.
SESSION_HELPERS = (*MULTIPROCESSING_HELPERS, "tests.examples.script_zygote")


def descendants(root: int | None = None) -> dict[int, tuple[int, str]]:
    """The live descendants of process `root` (default: this one) at the OS level (zombies
    included): pid -> (parent pid, command line)."""
    parents = process_parents()
    found: dict[int, tuple[int, str]] = {}
    frontier = [os.getpid() if root is None else root]
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


# The processes of the test run's local Ray cluster (tests/ray_session.py: its raylet, GCS and
# helpers, and the worker processes Ray names "ray::IDLE", "ray::<Actor>"): Ray starts and
# reaps them as it sees fit, during any test. tests/collectors/ray checks its actors'
# processes itself; what an actor starts (a fork server, collector workers) is checked like any
# other process.
RAY_TITLE = re.compile(r"^\[?ray::")
RAY_PROGRAM = re.compile(r"/ray/(core/src/ray/\S+|(_private|dashboard|autoscaler)/\S+\.py)$")
# The session cluster's workers start through a launcher and are forked from a zygote
# (tests/ray_zygote.py): both are Ray's processes too.
RAY_ZYGOTE = ("/tests/ray_zygote.py", "tests.ray_zygote")
# Ray's object store, which the session's driver (this process) maps once Ray runs.
RAY_OBJECT_STORE = re.compile(r"/dev/shm/plasma\w{6}")


def leftover_processes(before: dict[int, tuple[int, str]]) -> dict[int, str]:
    """The descendants started since `before`, except this process's helpers (multiprocessing's
    and the script zygote: the workers and script runs forked from them share their command
    line but not their parent) and Ray's own."""
    me = os.getpid()
    return {
        pid: command
        for pid, (ppid, command) in descendants().items()
        if pid not in before
        and not (ppid == me and any(helper in command for helper in SESSION_HELPERS))
        and not is_ray_process(command)
    }


def is_ray_process(command: str) -> bool:
    """Whether a command line is one of Ray's processes: by the title Ray gives its workers,
    or by the program run (a Ray binary, a Ray script run by Python, or the session cluster's
    worker launcher and zygote)."""
    words = command.split()
    if not words:
        return False
    if RAY_TITLE.match(words[0]) or any(word.endswith(RAY_ZYGOTE) for word in words[1:3]):
        return True
    program = words[0]
    if Path(program).name.startswith("python"):
        program = next((word for word in words[1:] if not word.startswith("-")), "")
    return bool(RAY_PROGRAM.search(program))


def is_shared_memory(path: str) -> bool:
    return "/dev/shm/" in path and not RAY_OBJECT_STORE.search(path)


def shared_memory_held() -> int:
    """How many shared-memory files this process maps or holds open (named or unlinked),
    Ray's object store aside."""
    lines = Path("/proc/self/maps").read_text().splitlines()
    held = sum(is_shared_memory(line) for line in lines)
    for fd in Path("/proc/self/fd").iterdir():
        try:
            held += is_shared_memory(os.readlink(fd))
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
    # A background thread (a collector's watchdog that shut it down) may still be letting go
    # of its mappings on a loaded machine: what is still held after 5 s is held.
    deadline = time.monotonic() + 5.0
    while shared_memory_held() > shared and time.monotonic() < deadline:
        time.sleep(0.05)
        gc.collect()
    assert shared_memory_held() <= shared, "shared memory is still mapped or held open"


def processes_gone(pids: list[int], within: float) -> bool:
    """Whether every process of `pids` has ended (or is a zombie) within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                alive.append(pid)
        if not alive:
            return True
        time.sleep(0.05)
    return False

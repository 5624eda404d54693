"""Prompt exits: a process that Ctrl-C ends skips its last collections; the fork server ends
with its parent without the interpreter's teardown."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from rlcollect.runtime import exits
from rlcollect.runtime.processes import OK, WorkerHandle, worker_context
from tests.conftest import processes_gone

REPOSITORY = Path(__file__).resolve().parents[2]
# An atexit handler registered before the hook runs after it (last in, first out): it sees
# whether the hook froze the objects.
ENDING = """
    import atexit, gc, sys
    atexit.register(lambda: print("frozen", gc.get_freeze_count() > 0, flush=True))
    from rlcollect.runtime.exits import exit_promptly_on_interrupt
    exit_promptly_on_interrupt()
    exit_promptly_on_interrupt()  # once per process
    {ending}
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("ending", "frozen"),
    [
        # Python's Ctrl-C handler first: a child of `pytest &` inherits an ignored SIGINT.
        (
            "import os, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "os.kill(os.getpid(), signal.SIGINT)",
            True,
        ),
        ("sys.exit(0)", False),
        ("raise ValueError('not an interrupt')", False),
    ],
)
def test_only_a_process_ended_by_ctrl_c_skips_its_last_collections(
    ending: str, frozen: bool
) -> None:
    script = textwrap.dedent(ENDING).replace("{ending}", ending)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPOSITORY, timeout=100
    )
    assert done.stdout.split() == ["frozen", str(frozen)], done.stderr[-2000:]


def report_fork_server_state(index: int, connection: Connection) -> None:
    """A worker's target: whether the fork server it came from armed its prompt exit, and
    whether the worker itself passes for a fork server."""
    state = (exits.LOADED_BY_FORK_SERVER, exits.in_fork_server_preload())
    connection.send_bytes(OK + pickle.dumps(state))
    connection.recv_bytes()  # until told to close


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
def test_the_fork_server_arms_its_prompt_exit_and_its_workers_do_not_pass_for_one() -> None:
    handle = WorkerHandle(
        0, worker_context("forkserver"), report_fork_server_state, name="exits-probe"
    )
    try:
        loaded_by_server, in_preload = pickle.loads(handle.receive(timeout=90))
    finally:
        handle.request_close(b"close")
        handle.finish(timeout=5)
    assert loaded_by_server, "the fork server did not arm its prompt exit"
    assert not in_preload, "a worker took itself for the fork server"
    assert not exits.LOADED_BY_FORK_SERVER, "this process took itself for a fork server"


# A user's function run in a `spawn` child that leaves its collector running when it returns
# (an assertion failed before `shutdown()`, as in TorchRL's threading test), and the script
# that runs it. The child reports its workers' pids before it returns.
LEFT_RUNNING = """
import multiprocessing


def leave_a_collector_running(pids):
    from rlcollect.collectors import MultiSyncCollector
    from rlcollect.envs import GymEnv

    collector = MultiSyncCollector(
        [lambda: GymEnv("CartPole-v1")] * 2, None, frames_per_batch=8, total_frames=-1
    )
    next(iter(collector))
    pids.put(collector.process_ids())


if __name__ == "__main__":
    context = multiprocessing.get_context("spawn")
    pids = context.Queue()
    child = context.Process(target=leave_a_collector_running, args=(pids,))
    child.start()
    workers = pids.get(timeout=120)
    child.join(60)
    print(child.exitcode, " ".join(map(str, workers)), flush=True)
    if child.is_alive():
        child.kill()
"""


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("no_leftover_children")
def test_a_spawn_child_that_leaves_a_collector_running_still_exits(tmp_path: Path) -> None:
    """multiprocessing's own exit in a child it started joins every child that is not a daemon
    before `atexit` handlers run; our workers are not daemons, so they are told to close
    first (`workers_finalizer`), else the child waits for them forever."""
    script = tmp_path / "left_running.py"
    script.write_text(LEFT_RUNNING)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=200
    )
    exitcode, *workers = done.stdout.split()
    assert exitcode == "0", f"the child did not end by itself: {done.stderr[-3000:]}"
    assert len(workers) == 2
    assert processes_gone([int(pid) for pid in workers], 10.0)

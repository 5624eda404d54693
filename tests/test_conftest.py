"""Tests for the shared `no_leftover_children` fixture, run in a separate pytest process: it
flags what our tests leave behind, and not what another program on the machine makes meanwhile."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CASES = '''
import _multiprocessing
import multiprocessing
import os
import subprocess
import sys
import time
from multiprocessing import shared_memory

import pytest

# Another program on the machine: it makes named semaphores while a test runs, keeps two open
# and leaves one on disk that nobody holds (as a crashed program would), then waits.
FOREIGN = """
import _multiprocessing, os, sys
names = [f"/mp-{os.urandom(4).hex()}" for _ in range(3)]
held = [_multiprocessing.SemLock(1, 1, 1, name, False) for name in names]
held.pop()
print(" ".join(names), flush=True)
sys.stdin.read()
for name in names:
    _multiprocessing.sem_unlink(name)
"""
LEAKED = multiprocessing.current_process()._config["semprefix"] + "-leaked"


@pytest.fixture(scope="module")
def foreign_programs():
    programs = []
    yield programs
    for program in programs:
        program.communicate(timeout=10)
    _multiprocessing.sem_unlink(LEAKED)


def test_joined_child_is_fine(no_leftover_children):
    child = multiprocessing.Process(target=time.sleep, args=(0.01,))
    child.start()
    child.join()


def test_leftover_child_fails(no_leftover_children):
    multiprocessing.Process(target=time.sleep, args=(30,), daemon=True).start()


def test_leftover_shared_memory_fails(no_leftover_children):
    # named for this process: another test process's leak check must not take it for its own
    block = shared_memory.SharedMemory(name=f"rlcdeliberate{os.getpid()}-x", create=True, size=16)
    block.close()


def test_foreign_semaphores_are_not_counted(no_leftover_children, foreign_programs):
    program = subprocess.Popen(
        [sys.executable, "-c", FOREIGN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    foreign_programs.append(program)
    names = program.stdout.readline().split()
    assert len(names) == 3
    assert all(os.path.exists(f"/dev/shm/sem.{name[1:]}") for name in names)


def test_our_leftover_semaphore_fails(no_leftover_children, foreign_programs):
    _multiprocessing.SemLock(1, 1, 1, LEAKED, False)
'''


@pytest.mark.timeout(60)
def test_fixture_flags_our_leftovers_only(tmp_path: Path) -> None:
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_cases.py").write_text(CASES)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_cases.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=50,
    )
    output = result.stdout + result.stderr
    # a teardown failure reports the test as passed and adds an error
    assert "5 passed, 3 errors" in output, output
    assert "ERROR test_cases.py::test_leftover_child_fails" in output
    assert "ERROR test_cases.py::test_leftover_shared_memory_fails" in output
    assert "ERROR test_cases.py::test_our_leftover_semaphore_fails" in output
    assert "the test left child processes alive" in output
    assert "the test left shared memory behind in /dev/shm: ['rlcdeliberate" in output
    assert "the test left shared memory behind in /dev/shm: ['sem.mp-rlctest" in output
    # another program's semaphores, held or not, made during a test, are not that test's leak
    assert "test_foreign_semaphores_are_not_counted" not in output

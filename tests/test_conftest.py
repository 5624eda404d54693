"""Tests for the shared `no_leftover_children` fixture, run in a separate pytest process."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CASES = """
import multiprocessing
import time
from multiprocessing import shared_memory


def test_joined_child_is_fine(no_leftover_children):
    child = multiprocessing.Process(target=time.sleep, args=(0.01,))
    child.start()
    child.join()


def test_leftover_child_fails(no_leftover_children):
    multiprocessing.Process(target=time.sleep, args=(30,), daemon=True).start()


def test_leftover_shared_memory_fails(no_leftover_children):
    block = shared_memory.SharedMemory(create=True, size=16)
    block.close()
"""


@pytest.mark.timeout(60)
def test_fixture_flags_leftover_children_and_shared_memory(tmp_path: Path) -> None:
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
    assert "3 passed, 2 errors" in output, output
    assert "ERROR test_cases.py::test_leftover_child_fails" in output
    assert "ERROR test_cases.py::test_leftover_shared_memory_fails" in output
    assert "the test left child processes alive" in output
    assert "the test left shared memory behind in /dev/shm: ['psm_" in output

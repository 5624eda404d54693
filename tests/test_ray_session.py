"""The guard of tests/ray_session.py, in pytest runs of their own (two xdist workers): a run
whose test processes start two Ray clusters fails and names them; a run whose Ray tests use the
session's cluster runs them in one worker, starts one cluster and passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

REPOSITORY = Path(__file__).resolve().parents[1]
PYTEST = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.ray_session"]
XDIST = ["-n", "2", "--dist", "loadgroup"]
CASES = {
    # One worker starts (and stops) two clusters, one after the other: its count reaches the
    # controller, which fails the run.
    "own": """
import pytest
import ray

def start_and_stop_a_cluster():
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    ray.shutdown()

@pytest.mark.xdist_group("one_worker")
def test_one():
    start_and_stop_a_cluster()

@pytest.mark.xdist_group("one_worker")
def test_two():
    start_and_stop_a_cluster()
""",
    # Two Ray tests that use the session's cluster: one worker runs both (each notes which).
    "session": """
import os
import ray

def note_worker():
    with open("workers.txt", "a") as file:
        file.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

def test_one(ray_cluster):
    note_worker()
    assert ray.is_initialized()

def test_two(ray_cluster):
    note_worker()
    assert ray.is_initialized()
""",
}


def run_pytest(tmp_path: Path, case: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_cases.py").write_text(CASES[case])
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    env.pop("RAY_ADDRESS", None)
    env["RAY_raylet_start_wait_time_s"] = "240"  # a busy machine
    return subprocess.run(
        [sys.executable, *PYTEST, *XDIST, "test_cases.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_a_run_that_starts_two_clusters_fails_naming_them(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, "own")
    output = result.stdout + result.stderr
    assert "2 passed" in output, output
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, output
    assert "the test processes started 2 Ray clusters (session_" in output, output


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_a_run_on_the_session_cluster_starts_one_and_passes(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, "session")
    output = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.OK, output
    assert "2 passed" in output
    assert "Ray cluster" not in output
    workers = (tmp_path / "workers.txt").read_text().split()
    assert len(workers) == 2
    assert len(set(workers)) == 1, f"the Ray tests ran on {workers}: not grouped"

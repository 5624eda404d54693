"""The guard of tests/ray_session.py, in a pytest run of its own (two xdist workers): a run
whose test processes start two Ray clusters fails and names them. The other half, a run whose
Ray tests use the session's cluster and pass, is every run of this suite: its Ray tests start
one cluster in one worker, or the guard fails the run."""

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
# One worker starts (and stops) two clusters, one after the other: its count reaches the
# controller, which fails the run.
TWO_CLUSTERS = """
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
"""


def run_pytest(tmp_path: Path, tests: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_cases.py").write_text(tests)
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
    result = run_pytest(tmp_path, TWO_CLUSTERS)
    output = result.stdout + result.stderr
    assert "2 passed" in output, output
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, output
    assert "the test processes started 2 Ray clusters (session_" in output, output

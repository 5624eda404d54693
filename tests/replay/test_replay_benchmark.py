"""The replay benchmark runs end to end in its quick mode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_replay_benchmark_quick_run_prints_the_table() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "replay.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    for row in ("tensor+random", "memmap+random", "tensor+prioritized", "ratio"):
        assert row in result.stdout

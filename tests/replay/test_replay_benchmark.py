"""The replay benchmark runs end to end in its quick mode, as `python benchmarks/replay.py
--quick` runs it, in a child of the script zygote (tests/examples/script_runner.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.examples.script_runner import zygote

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_replay_benchmark_quick_run_prints_the_table() -> None:
    argv = [str(ROOT / "benchmarks" / "replay.py"), "--quick"]
    result = zygote().run(argv, dict(os.environ), timeout=110)
    assert result.returncode == 0, result.stderr
    for row in ("tensor+random", "memmap+random", "tensor+prioritized", "ratio"):
        assert row in result.stdout

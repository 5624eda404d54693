"""examples/collect.py end to end, on the batched image env: outputs, frames/s, resuming."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.examples.script_runner import (
    check_run_outputs,
    check_succeeded,
    checkpoint_frames,
    run_script,
)

TINY = ("env=catch_batched", "env.num_envs=2", "collector.frames_per_batch=500")


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("no_leftover_children")
def test_collect_prints_frames_per_second_and_resumes(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    result = run_script("collect", first, *TINY, "collector.total_frames=2000")
    check_succeeded(result)
    check_run_outputs(first)
    assert "collected 2000 frames in" in result.stdout
    assert "frames/s (env common.catch:Catch-v0, batch (2,), policy Actor)" in result.stdout
    assert "the average over the whole run" in result.stdout, "says which rate it prints"
    assert "collected 2000 frames in" in (first / "collect.log").read_text(), "the job log"
    assert checkpoint_frames(first) == 2000

    resumed = run_script(
        "collect", second, *TINY, "collector.total_frames=3000", f"resume={first / 'checkpoint.pt'}"
    )
    check_succeeded(resumed)
    assert "collected 1000 frames in" in resumed.stdout
    with (second / "metrics.csv").open(newline="") as file:
        frames = [int(row["frames"]) for row in csv.DictReader(file)]
    assert frames == [500, 1000, 1500, 2000, 2500, 3000], "the first run's rows carried over"
    assert checkpoint_frames(second) == 3000

"""examples/dqn.py end to end: background collection, outputs, resuming in the same run dir."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from tests.examples.dqn_runs import TINY
from tests.examples.script_runner import (
    check_run_outputs,
    check_succeeded,
    checkpoint_frames,
    run_script,
)


def metric_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open(newline="") as file:
        return list(csv.DictReader(file))


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("no_leftover_children")
def test_dqn_trains_in_the_background_then_resumes(tmp_path: Path) -> None:
    result = run_script("dqn", tmp_path, *TINY, "collector.total_frames=2048")
    check_succeeded(result)
    check_run_outputs(tmp_path)
    rows = metric_rows(tmp_path)
    assert int(rows[-1]["frames"]) == 2048
    assert checkpoint_frames(tmp_path) == 2048
    updates = int(rows[-1]["updates"])
    # one gradient step per 2 frames once 256 frames are in the buffer (the last batch may be
    # counted before the learner catches up with it)
    assert (2048 - 256) // 2 - 32 <= updates <= (2048 - 256) // 2
    assert float(rows[-1]["epsilon"]) < 1.0, "the learner pushed a decayed epsilon"
    evaluated = [float(row["eval_return"]) for row in rows if row["eval_return"]]
    assert evaluated, "a greedy evaluation every 1024 frames"
    best = torch.load(tmp_path / "best_policy.pt", weights_only=True)
    assert best["eval_return"] == max(evaluated)
    assert best["frames"] in {int(row["frames"]) for row in rows}, "one frame count per row"
    cells = [int(row["frames"]) // 512 for row in rows[:-1]]
    assert cells == sorted(set(cells)), "one row per log_every interval, on its grid"
    assert "q_network.head.weight" in best["policy"]
    assert "best policy (" in result.stdout
    assert "best policy (" in (tmp_path / "dqn.log").read_text(), "the job log"

    resumed = run_script(
        "dqn",
        tmp_path,
        *TINY,
        "collector.total_frames=3072",
        f"resume={tmp_path / 'checkpoint.pt'}",
    )
    check_succeeded(resumed)
    rows = metric_rows(tmp_path)
    frames = [int(row["frames"]) for row in rows]
    assert frames == sorted(frames), "the resumed run appends to the same metrics.csv"
    assert frames[-1] == 3072
    assert checkpoint_frames(tmp_path) == 3072
    assert int(rows[-1]["updates"]) > updates, "the update count goes on"
    best_so_far = torch.load(tmp_path / "best_policy.pt", weights_only=True)["eval_return"]

    elsewhere = tmp_path / "elsewhere"  # resuming into a new run dir keeps the best policy
    moved = run_script(
        "dqn",
        elsewhere,
        *TINY,
        "collector.total_frames=4096",
        f"resume={tmp_path / 'checkpoint.pt'}",
    )
    check_succeeded(moved)
    best = torch.load(elsewhere / "best_policy.pt", weights_only=True)
    assert best["eval_return"] >= best_so_far


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
def test_dqn_trains_with_async_workers_writing_the_buffer(tmp_path: Path) -> None:
    result = run_script(
        "dqn", tmp_path, *TINY, "collector=multiasync", "collector.total_frames=2048"
    )
    check_succeeded(result)
    check_run_outputs(tmp_path)
    rows = metric_rows(tmp_path)
    assert int(rows[-1]["frames"]) == 2048, "the workers stop at their shares of total_frames"
    assert int(rows[-1]["buffer_size"]) == 2048
    assert checkpoint_frames(tmp_path) == 2048
    assert int(rows[-1]["updates"]) > 0
    assert float(rows[-1]["epsilon"]) < 1.0

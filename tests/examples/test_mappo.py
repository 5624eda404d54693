"""examples/mappo.py end to end: a short run, learning against a random policy, config errors."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from tests.examples.mappo_runs import TINY
from tests.examples.script_runner import (
    check_run_outputs,
    check_succeeded,
    checkpoint_frames,
    run_script,
)

pytest.importorskip("mpe2")

EVALUATION = re.compile(
    r"greedy evaluation: mean return per agent (-?[\d.]+) over (\d+) episodes; "
    r"random policy, same episodes: (-?[\d.]+)"
)


def metrics(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open(newline="") as file:
        return list(csv.DictReader(file))


def evaluations(stdout: str) -> tuple[float, float]:
    """The trained and the random policy's mean return per agent, as the run printed them."""
    found = EVALUATION.search(stdout)
    assert found, stdout
    return float(found.group(1)), float(found.group(3))


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("no_leftover_children")
def test_mappo_runs_and_reports_the_trained_and_random_policies(tmp_path: Path) -> None:
    result = run_script("mappo", tmp_path, *TINY, "collector.total_frames=300")
    check_succeeded(result)
    check_run_outputs(tmp_path)
    rows = metrics(tmp_path)
    assert [int(row["frames"]) for row in rows] == [100, 200, 300]
    assert checkpoint_frames(tmp_path) == 300
    trained, random = evaluations(result.stdout)
    assert float(rows[-1]["final_eval_return"]) == pytest.approx(trained, abs=0.01)
    assert float(rows[-1]["random_eval_return"]) == pytest.approx(random, abs=0.01)
    # returns are per agent: a 25-step simple_spread episode scores about -25 per agent at random
    assert -60 < float(rows[-1]["mean_episode_return"]) < -5
    assert "over 2 episodes" in (tmp_path / "mappo.log").read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("no_leftover_children")
def test_mappo_learns_to_beat_a_random_policy(tmp_path: Path) -> None:
    result = run_script(
        "mappo",
        tmp_path,
        "collector.total_frames=25000",  # about -22 against -29 at random
        "eval_episodes=20",
        "progress=false",
        timeout=280,
    )
    check_succeeded(result)
    trained, random = evaluations(result.stdout)
    assert trained > random + 3.0, (trained, random)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("env.group=agent", r"env.group='agent': the env has no observation under \('agent', "),
        ("ppo.epochs=0", r"ppo.epochs=0: expected a positive int"),
        ("collector.split_trajs=true", r"collector.split_trajs=True: MAPPO trains on"),
    ],
)
def test_mappo_config_errors_name_the_key(tmp_path: Path, override: str, message: str) -> None:
    result = run_script("mappo", tmp_path / "run", override)
    assert result.returncode != 0
    assert re.search(f"config error: {message}", result.stderr), result.stderr
    assert not (tmp_path / "run" / "metrics.csv").exists()

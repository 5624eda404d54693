"""examples/ppo.py under Hydra's Optuna sweeper (`--multirun +sweep=ppo_optuna`): the trials
run, each returns its training return as the objective, and the best one is reported."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.examples.script_runner import EXAMPLES, REPO_ROOT, check_succeeded


def final_window_return(trial_dir: Path) -> float:
    with (trial_dir / "metrics.csv").open(newline="") as file:
        return float(list(csv.DictReader(file))[-1]["mean_return_last_100"])


def trial_overrides(trial_dir: Path) -> dict[str, float]:
    overrides = yaml.safe_load((trial_dir / ".hydra" / "overrides.yaml").read_text())
    pairs = (override.split("=", 1) for override in overrides)
    return {key: float(value) for key, value in pairs if key in ("optim.lr", "ppo.clip_epsilon")}


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("no_leftover_children")
def test_optuna_sweep_reports_the_best_trial_of_ppo(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    result = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "ppo.py"),
            "--multirun",  # before the overrides: Hydra's parser takes no flag after them
            "+sweep=ppo_optuna",
            "hydra.sweeper.n_trials=2",
            f"hydra.sweep.dir={sweep_dir}",
            "env.num_envs=4",
            "collector.frames_per_batch=256",
            "collector.total_frames=512",
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    check_succeeded(result)
    trials = sorted(path for path in sweep_dir.iterdir() if path.is_dir())
    assert [trial.name for trial in trials] == ["0", "1"]
    objectives = {trial.name: final_window_return(trial) for trial in trials}
    sampled = {trial.name: trial_overrides(trial) for trial in trials}
    for params in sampled.values():
        assert 3e-4 <= params["optim.lr"] <= 1e-2
        assert 0.1 <= params["ppo.clip_epsilon"] <= 0.3
    assert sampled["0"] != sampled["1"], "Optuna proposes a new point per trial"

    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    best = max(objectives, key=objectives.__getitem__)
    # the objective is what the script returned: each trial's final 100-episode mean
    assert results["best_value"] == pytest.approx(objectives[best], rel=1e-5)  # CSV: 6 digits
    assert results["best_params"] == pytest.approx(sampled[best])
    output = result.stdout + result.stderr
    assert f"Best value: {results['best_value']}" in output
    assert "Best parameters: {'optim.lr': " in output

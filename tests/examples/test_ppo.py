"""examples/ppo.py end to end: outputs, progress bar, resuming, and a config error."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from tests.examples.script_runner import (
    check_run_outputs,
    check_succeeded,
    checkpoint_frames,
    run_script,
)

TINY = (
    "env.num_envs=4",
    "collector.frames_per_batch=256",
    "checkpoint_every=512",
    "eval_episodes=1",
)


def logged(run_dir: Path, column: str) -> list[float]:
    with (run_dir / "metrics.csv").open(newline="") as file:
        return [float(row[column]) for row in csv.DictReader(file)]


def logged_frames(run_dir: Path) -> list[int]:
    with (run_dir / "metrics.csv").open(newline="") as file:
        return [int(row["frames"]) for row in csv.DictReader(file)]


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("no_leftover_children")
def test_ppo_runs_then_resumes_where_it_stopped(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    result = run_script("ppo", first, *TINY, "collector.total_frames=1024")
    check_succeeded(result)
    check_run_outputs(first)
    assert logged_frames(first) == [256, 512, 768, 1024]
    assert checkpoint_frames(first) == 1024
    assert "frame/s" in result.stderr, "the tqdm progress bar shows frames/s"
    assert "greedy evaluation: mean return" in result.stdout
    assert "greedy evaluation: mean return" in (first / "ppo.log").read_text(), "the job log"
    with (first / "metrics.csv").open(newline="") as file:
        final = float(list(csv.DictReader(file))[-1]["final_eval_return"])
    assert f"greedy evaluation: mean return {final:.1f}" in result.stdout, "in the CSV too"
    # ppo.anneal_clip: the clip range decays with the learning rate's factor (RL Zoo's lin_0.2)
    lrs, clips = logged(first, "lr"), logged(first, "clip_epsilon")
    assert clips[0] == pytest.approx(0.2)
    assert [clip / 0.2 for clip in clips] == pytest.approx([lr / lrs[0] for lr in lrs])
    assert clips == sorted(clips, reverse=True)
    assert clips[-1] < clips[0]

    resumed = run_script(
        "ppo", second, *TINY, "collector.total_frames=2048", f"resume={first / 'checkpoint.pt'}"
    )
    check_succeeded(resumed)
    check_run_outputs(second)
    # One file tells the whole run: the first run's rows, then the new ones.
    assert logged_frames(second) == [256, 512, 768, 1024, 1280, 1536, 1792, 2048]
    assert checkpoint_frames(second) == 2048
    # With twice the frames, the learning rate goes on down from where it stopped.
    last_lr, resumed_lrs = logged(first, "lr")[-1], logged(second, "lr")[4:]
    assert resumed_lrs[0] == pytest.approx(last_lr)
    assert resumed_lrs == sorted(resumed_lrs, reverse=True)
    resumed_clips = logged(second, "clip_epsilon")[4:]
    assert resumed_clips[0] == pytest.approx(0.2 * last_lr / lrs[0])  # goes on, no jump back
    assert "the learning rate goes on from" in (second / "ppo.log").read_text()


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children")
def test_ppo_config_error_stops_before_any_work_naming_the_key(tmp_path: Path) -> None:
    result = run_script("ppo", tmp_path, "collector.frames_per_batch=-5")
    assert result.returncode != 0
    assert "config error: collector.frames_per_batch=-5" in result.stderr
    assert not (tmp_path / "metrics.csv").exists()
    assert not (tmp_path / "checkpoint.pt").exists()
    assert not tmp_path.exists() or not any(tmp_path.iterdir()), "no empty run dir is left"


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
def test_ppo_trains_with_the_multi_process_collector(tmp_path: Path) -> None:
    result = run_script(
        "ppo", tmp_path, *TINY, "collector=multisync", "collector.total_frames=1024"
    )
    check_succeeded(result)
    check_run_outputs(tmp_path)
    assert logged_frames(tmp_path) == [256, 512, 768, 1024]
    with (tmp_path / "metrics.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    assert int(rows[-1]["episodes"]) > 0
    assert float(rows[-1]["mean_return_last_100"]) > 0


def test_ppo_trains_with_the_batched_collector(tmp_path: Path) -> None:
    """`collector=batched`: env worker processes step one env each, one inference server
    batches their policy calls (a run of 4 batches, checkpoint and metrics as with the
    others)."""
    result = run_script(
        "ppo",
        tmp_path,
        *TINY[1:],
        "env=cartpole",
        "collector=batched",
        "collector.total_frames=1024",
    )
    check_succeeded(result)
    check_run_outputs(tmp_path)
    assert logged_frames(tmp_path) == [256, 512, 768, 1024]


@pytest.mark.timeout(120)
def test_a_misspelt_key_without_plus_gets_the_closest_key(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = run_script("ppo", run_dir, "collector.total_frame=1000")
    assert result.returncode != 0
    message = "config error: collector.total_frame: the config has no such key. Did you mean "
    assert message + "collector.total_frames?" in result.stderr
    assert not run_dir.exists(), "stopped before Hydra made a run dir"


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("no_leftover_children")
def test_ppo_evaluates_greedily_in_the_background_and_keeps_the_best(tmp_path: Path) -> None:
    """`eval_every`: greedy episodes in an evaluator process while training goes on; their
    returns land in `eval_return`, the best policy in best_policy.pt, re-evaluated at the end."""
    result = run_script(
        "ppo", tmp_path, *TINY, "collector.total_frames=1536", "eval_every=512", "eval_episodes=2"
    )
    check_succeeded(result)
    with (tmp_path / "metrics.csv").open(newline="") as file:
        returns = [float(row["eval_return"]) for row in csv.DictReader(file) if row["eval_return"]]
    assert returns, "at least one background evaluation reported"
    assert all(9 <= value <= 500 for value in returns)  # CartPole's returns, whole episodes
    best = torch.load(tmp_path / "best_policy.pt", weights_only=True)
    assert best["frames"] in (512, 1024, 1536)
    assert best["eval_return"] == pytest.approx(max(returns), abs=0.01)  # the CSV rounds
    assert set(best["policy"]) == set(torch.load(tmp_path / "checkpoint.pt")["actor"])
    assert "best policy (" in result.stdout

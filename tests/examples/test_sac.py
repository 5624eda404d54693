"""examples/sac.py end to end: background collection throttled to the learner, outputs,
resuming, and the config checks."""

from __future__ import annotations

import csv
import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from tests.examples.script_runner import (
    EXAMPLES,
    check_run_outputs,
    check_succeeded,
    checkpoint_frames,
    run_script,
)

BATCH = 50
STARTS = 200
TINY = (
    f"collector.frames_per_batch={BATCH}",
    f"collector.init_random_frames={STARTS}",
    f"sac.learning_starts={STARTS}",
    f"sac.collect_ahead={BATCH}",  # collection and learning take turns
    "actor.hidden_sizes=[32,32]",
    "critic.hidden_sizes=[32,32]",
    "replay_buffer.batch_size=32",
    "log_every=200",
    "eval_episodes=1",
    "progress=false",
)


CLOCK_COLUMNS = ("wall_time_s", "frames_per_second", "weight_update_s")


def metric_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open(newline="") as file:
        return list(csv.DictReader(file))


def without_clock(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [{k: v for k, v in row.items() if k not in CLOCK_COLUMNS} for row in rows]


@pytest.fixture(scope="module")
def sac() -> Iterator[ModuleType]:
    """examples/sac.py as a module, as `python examples/sac.py` imports it."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield importlib.import_module("sac")
    finally:
        sys.path.remove(str(EXAMPLES))


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("no_leftover_children")
def test_sac_learns_beside_a_throttled_collector_repeatably_then_resumes(tmp_path: Path) -> None:
    result = run_script(
        "sac", tmp_path, *TINY, "collector.total_frames=800", "checkpoint_every=400"
    )
    check_succeeded(result)
    check_run_outputs(tmp_path)
    rows = metric_rows(tmp_path)
    first_rows = rows
    frames = [int(row["frames"]) for row in rows]
    # a row per 200 frames (when the learner sees them), and one once it has caught up
    cells = [frame // 200 for frame in frames[:-1]]
    assert cells == sorted(set(cells)), frames
    assert frames[-1] == 800
    last = rows[-1]
    assert int(last["updates"]) == 800 - STARTS, "one gradient step per frame past the start"
    assert int(last["buffer_size"]) == 800
    for row in rows:  # the learner had trained on all but the last batch at most
        behind = int(row["frames"]) - STARTS - int(row["updates"])
        assert behind <= BATCH, row
    # 4 Pendulum episodes of 200 steps: the 10-episode window holds all of them, as does the
    # collector's own 100-episode one
    assert int(last["episodes"]) == 4
    assert float(last["mean_return_last_10"]) == pytest.approx(
        float(last["mean_return_last_100"]), rel=1e-5
    )
    assert float(last["alpha"]) < 1.0, "the temperature is tuned down from sac.init_alpha"
    assert float(last["loss_critic"]) > 0
    assert "greedy evaluation: mean return" in result.stdout
    state = torch.load(tmp_path / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert state["frames"] == 800
    assert state["updates"] == 800 - STARTS
    assert state["script"] == "sac"
    assert state["log_alpha"].exp().item() == pytest.approx(float(last["alpha"]), rel=1e-4)

    # seed=: the same seed trains the same (the throttle has them take turns)
    again = run_script(
        "sac", tmp_path / "again", *TINY, "collector.total_frames=800", "checkpoint_every=400"
    )
    check_succeeded(again)
    assert without_clock(metric_rows(tmp_path / "again")) == without_clock(rows)

    resumed = run_script(
        "sac",
        tmp_path,
        *TINY,
        "collector.total_frames=1200",
        f"resume={tmp_path / 'checkpoint.pt'}",
    )
    check_succeeded(resumed)
    rows = metric_rows(tmp_path)
    assert rows[: len(first_rows)] == first_rows, "the resumed run appends to the same CSV"
    frames = [int(row["frames"]) for row in rows]
    assert frames == sorted(frames)
    assert frames[-1] == 1200
    assert checkpoint_frames(tmp_path) == 1200
    # the buffer starts empty: learning waits for STARTS new frames, then goes on counting
    assert int(rows[-1]["updates"]) == (800 - STARTS) + (400 - STARTS)
    assert "resumed at 800 frames, 600 updates" in (tmp_path / "sac.log").read_text()


def sac_config(*overrides: str) -> DictConfig:
    with initialize_config_dir(str(EXAMPLES / "conf"), version_base=None):
        return compose("sac", overrides=list(overrides))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("collector=multisync",), "collector: rlcollect.collectors.MultiSyncCollector collects"),
        (("sac.utd_ratio=0",), "sac.utd_ratio=0: expected a number > 0"),
        (("sac.tau=1.5",), "sac.tau=1.5: expected a number in [0, 1]"),
        (("sac.learning_starts=200000",), "sac.learning_starts=200000 is more than the buffer"),
        (("sac.collect_ahead=0",), "sac.collect_ahead=0: expected a positive int"),
        (("video.max_steps=0",), "video.max_steps=0: expected a positive int"),
        (("logger._target_=no.such.Logger",), "logger._target_='no.such.Logger' cannot be"),
    ],
)
def test_sac_config_errors_name_the_key(
    sac: ModuleType, overrides: tuple[str, ...], message: str
) -> None:
    with pytest.raises(sac.ConfigError, match=re.escape(message)):
        sac.check_config(sac_config(*overrides))


def test_sac_refuses_discrete_actions(sac: ModuleType) -> None:
    cfg = sac_config("env=cartpole")
    info = sac.probe_env(sac.build_partial(cfg, "env.make"))
    message = "env.id='CartPole-v1': SAC squashes actions"
    with pytest.raises(sac.ConfigError, match=re.escape(message)):
        sac.build_actor_and_critic(cfg, info)


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("no_leftover_children")
def test_sac_evaluates_greedily_in_the_background(tmp_path: Path) -> None:
    """`eval_every`: greedy Pendulum episodes in an evaluator process while the learner
    trains; their returns land in `eval_return`, the best policy in best_policy.pt."""
    result = run_script(
        "sac", tmp_path, *TINY, "collector.total_frames=800", "eval_every=400", "eval_episodes=1"
    )
    check_succeeded(result)
    returns = [float(row["eval_return"]) for row in metric_rows(tmp_path) if row["eval_return"]]
    assert returns, "at least one background evaluation reported"
    assert all(-2000 < value <= 0 for value in returns)  # Pendulum: 200 steps of reward <= 0
    best = torch.load(tmp_path / "best_policy.pt", weights_only=True)
    assert best["eval_return"] == pytest.approx(max(returns), abs=0.01)  # the CSV rounds
    assert "best policy (" in result.stdout

"""examples/ppo_rollout_buffer.py, the RolloutBuffer page's PPO: end to end on a tiny budget,
resuming, its config checks, and (slow) solving CartPole with the default budget."""

from __future__ import annotations

import csv
import importlib
from pathlib import Path
from types import ModuleType

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from tests.examples.script_runner import (
    EXAMPLES,
    check_run_outputs,
    check_succeeded,
    checkpoint_frames,
    run_script,
)

SCRIPT = "ppo_rollout_buffer"
TINY = (
    "env.num_envs=4",
    "collector.frames_per_batch=256",
    "checkpoint_every=512",
    "eval_episodes=1",
)


def rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open(newline="") as file:
        return list(csv.DictReader(file))


@pytest.fixture
def script(scripts: dict[str, ModuleType]) -> ModuleType:
    """The script as a module (the `scripts` fixture puts examples/ on sys.path)."""
    return importlib.import_module(SCRIPT)


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("no_leftover_children")
def test_runs_the_page_s_steps_then_resumes_where_it_stopped(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    result = run_script(SCRIPT, first, *TINY, "collector.total_frames=1024")
    check_succeeded(result)
    check_run_outputs(first)
    logged = rows(first)
    assert [int(row["frames"]) for row in logged] == [256, 512, 768, 1024]
    assert int(logged[-1]["episodes"]) > 0
    assert all(float(row["loss_value"]) > 0 for row in logged), "GAE gave value targets"
    assert checkpoint_frames(first) == 1024
    assert "greedy evaluation: mean return" in result.stdout

    resumed = run_script(
        SCRIPT, second, *TINY, "collector.total_frames=1536", f"resume={first / 'checkpoint.pt'}"
    )
    check_succeeded(resumed)
    assert [int(row["frames"]) for row in rows(second)] == [256 * i for i in range(1, 7)]
    assert checkpoint_frames(second) == 1536


def config(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(EXAMPLES / "conf"), version_base=None):
        return compose(config_name=SCRIPT, overrides=list(overrides))


def test_the_config_is_ppo_s_with_gae_over_the_rollout(script: ModuleType) -> None:
    cfg = config()
    with initialize_config_dir(config_dir=str(EXAMPLES / "conf"), version_base=None):
        reference = compose(config_name="ppo")
    assert cfg.gae._target_ == "rlcollect.transforms.RolloutGAE"
    for key in ("collector", "actor", "critic", "optim", "ppo", "env"):
        assert cfg[key] == reference[key], key
    assert (cfg.gae.gamma, cfg.gae.lmbda) == (reference.gae.gamma, reference.gae.lmbda)
    script.check_config(cfg)


def test_collectors_whose_loops_run_elsewhere_are_refused(script: ModuleType) -> None:
    with pytest.raises(script.ConfigError, match=r"^collector: .*MultiSyncCollector.*single"):
        script.check_config(config("collector=multisync"))


def test_an_unbatched_env_is_refused_naming_the_fix(script: ModuleType) -> None:
    from common.config import build_partial
    from common.env_info import probe_env

    cfg = config("env=cartpole")
    info = probe_env(build_partial(cfg, "env.make"))
    with pytest.raises(script.ConfigError, match=r"^env: .*e.g. env=cartpole_batched"):
        script.buffer_sizes(cfg, info)
    batched = config()
    info = probe_env(build_partial(batched, "env.make"))
    assert script.buffer_sizes(batched, info) == (8, 32, 4, 1)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.usefixtures("no_leftover_children")
def test_the_default_run_solves_cartpole(tmp_path: Path) -> None:
    result = run_script(SCRIPT, tmp_path, "progress=false", timeout=540)
    check_succeeded(result)
    last = rows(tmp_path)[-1]
    assert float(last["mean_return_last_100"]) >= 475, last
    assert float(last["final_eval_return"]) >= 475, last


def test_runs_go_under_the_script_s_name() -> None:
    with initialize_config_dir(config_dir=str(EXAMPLES / "conf"), version_base=None):
        cfg = compose(config_name=SCRIPT, return_hydra_config=True)
    assert cfg.hydra.run.dir.startswith(f"outputs/{SCRIPT}/")
    assert cfg.hydra.sweep.dir.startswith(f"multirun/{SCRIPT}/")

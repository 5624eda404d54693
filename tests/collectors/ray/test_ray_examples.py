"""The examples with Ray: `collector=ray` for PPO and `collector=ray replay_buffer=ray` for DQN,
run end to end on the session's cluster (joined through its address), and their configs."""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterator
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

pytest.importorskip("ray")
pytest.importorskip("hydra")


def config(name: str, *overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(EXAMPLES / "conf"), version_base=None):
        return compose(config_name=name, overrides=list(overrides))


def metric_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open(newline="") as file:
        return list(csv.DictReader(file))


@pytest.fixture(scope="module")
def dqn() -> Iterator[ModuleType]:
    """examples/dqn.py as a module, as `python examples/dqn.py` sees it."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import dqn

        yield dqn
    finally:
        sys.path.remove(str(EXAMPLES))


def test_ray_configs_pass_the_checks_and_name_misspelt_keys(dqn: ModuleType) -> None:
    from common.config import ConfigError, validate

    validate(config("ppo", "collector=ray"), targets=["env.make", "collector"])
    dqn.check_config(config("dqn", "collector=ray", "replay_buffer=ray"))
    cfg = config("dqn", "collector=ray", "replay_buffer=ray")
    assert cfg.replay_buffer.ray_init_config == cfg.collector.ray_init_config
    for key, right in (
        ("num_colectors", "num_collectors"),  # RayCollector's own
        ("max_frames_per_trj", "max_frames_per_traj"),  # an option of the actors' collectors
    ):
        with pytest.raises(ConfigError, match=rf"Did you mean collector\.{right}\?"):
            validate(config("ppo", "collector=ray", f"+collector.{key}=3"), targets=["collector"])


def test_dqn_with_ray_actors_needs_a_buffer_they_can_reach(dqn: ModuleType) -> None:
    with pytest.raises(dqn.ConfigError, match=r"^replay_buffer: rlcollect.replay.ReplayBuffer"):
        dqn.check_config(config("dqn", "collector=ray"))


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
def test_ppo_trains_with_ray_actors(tmp_path: Path, ray_cluster: str) -> None:
    result = run_script(
        "ppo",
        tmp_path,
        "collector=ray",
        f"collector.ray_init_config.address={ray_cluster}",
        "env.num_envs=4",
        "collector.frames_per_batch=256",
        "collector.total_frames=1024",
        "checkpoint_every=512",
        "eval_episodes=1",
        timeout=200,
    )
    check_succeeded(result)
    check_run_outputs(tmp_path)
    rows = metric_rows(tmp_path)
    assert [int(row["frames"]) for row in rows] == [256, 512, 768, 1024]
    assert int(rows[-1]["episodes"]) > 0
    assert float(rows[-1]["mean_return_last_100"]) > 0
    assert checkpoint_frames(tmp_path) == 1024


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
def test_dqn_learns_while_ray_actors_fill_a_ray_replay_buffer(
    tmp_path: Path, ray_cluster: str
) -> None:
    result = run_script(
        "dqn",
        tmp_path,
        "collector=ray",
        "replay_buffer=ray",
        f"collector.ray_init_config.address={ray_cluster}",
        "collector.frames_per_batch=32",
        "collector.init_random_frames=256",
        "collector.total_frames=2048",
        "dqn.learning_starts=256",
        "log_every=512",
        "checkpoint_every=1024",
        "eval_episodes=1",
        "eval_every=1024",
        "progress=false",
        timeout=200,
    )
    check_succeeded(result)
    check_run_outputs(tmp_path)
    rows = metric_rows(tmp_path)
    assert int(rows[-1]["frames"]) == 2048, "the actors stop at their shares of total_frames"
    assert int(rows[-1]["buffer_size"]) == 2048
    assert checkpoint_frames(tmp_path) == 2048
    # One gradient step per 2 frames once 256 are in the buffer; the frame count polled from
    # the actors may trail the buffer's size by the batches in flight (2 x 16 frames).
    assert abs(int(rows[-1]["updates"]) - (2048 - 256) // 2) <= 32
    assert float(rows[-1]["epsilon"]) < 1.0

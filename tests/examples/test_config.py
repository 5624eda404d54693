"""Config checks of the example scripts, in process: every error names the config key to fix."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from tests.examples.script_runner import EXAMPLES


def config(name: str, *overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(EXAMPLES / "conf"), version_base=None):
        return compose(config_name=name, overrides=list(overrides))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["env.id=NoSuchEnv-v0"], r"^env.id='NoSuchEnv-v0' is not a registered Gymnasium env"),
        (["~collector._target_"], r"^collector: expected a config node with a _target_"),
        (["~optim._target_"], r"^optim: expected a config node with a _target_"),
        (["collector.frames_per_batch=-5"], r"^collector.frames_per_batch=-5: expected a pos"),
        (["collector.total_frames=0"], r"^collector.total_frames=0: expected a positive int"),
        (["gae.gamma=1.5"], r"^gae.gamma=1.5: expected a number in \[0, 1\]"),
        (["ppo.num_minibatches=4096"], r"^ppo.num_minibatches=4096 is larger than"),
        (["resume=/no/such/checkpoint.pt"], r"^resume='/no/such/checkpoint.pt': no checkpoint"),
        (["actor.hidden_sizes=${nowhere}"], r"^actor.hidden_sizes: "),
        (["seed=-1"], r"^seed=-1: expected an int >= 0"),
        (["seed=abc"], r"^seed='abc': expected an int >= 0"),
        (["checkpoint_every=abc"], r"^checkpoint_every='abc': expected an int >= 0"),
        (["eval_episodes=abc"], r"^eval_episodes='abc': expected an int >= 0"),
        (["progress=abc"], r"^progress='abc': expected true or false"),
        (["ppo.clip_epsilon=abc"], r"^ppo.clip_epsilon='abc': expected a number > 0"),
        (["collector.split_trajs=true"], r"^collector.split_trajs=True: PPO computes GAE"),
        (["collector.init_random_frames=256"], r"^collector.init_random_frames=256: PPO's loss"),
        (
            ["+collector.total_frame=1000"],
            r"^collector.total_frame: rlcollect.collectors.Collector takes no argument "
            r"'total_frame'. Did you mean collector.total_frames\?",
        ),
        (
            ["collector=multisync", "+collector.num_worker=2"],
            r"^collector.num_worker: .*MultiSyncCollector .* Did you mean collector.num_workers",
        ),
        (["optim.lr=abc"], r"^optim.lr='abc': expected a number \(like its default, 0.001\)"),
        (["+gae.lambda=0.9"], r"^gae.lambda: rlcollect.transforms.GAE .* gae.lmbda\?"),
    ],
)
def test_ppo_config_errors_name_the_key(
    scripts: dict[str, ModuleType], overrides: list[str], message: str
) -> None:
    with pytest.raises(scripts["ppo"].ConfigError, match=message):
        scripts["ppo"].check_config(config("ppo", *overrides))


@pytest.mark.parametrize("name", ["ppo", "dqn", "collect"])
@pytest.mark.parametrize("collector", ["single", "multisync", "multiasync", "batched"])
def test_default_configs_pass_the_checks(
    scripts: dict[str, ModuleType], name: str, collector: str
) -> None:
    from common.config import validate

    validate(config(name, f"collector={collector}"), targets=["env.make", "collector"])


def test_nested_target_arguments_are_checked(scripts: dict[str, ModuleType]) -> None:
    from common.config import ConfigError, validate

    cfg = config("dqn", "+replay_buffer.storage.max_sise=10")
    message = r"^replay_buffer.storage.max_sise: .* Did you mean replay_buffer.storage.max_size\?"
    with pytest.raises(ConfigError, match=message):
        validate(cfg, targets=["replay_buffer"])


@pytest.mark.parametrize("name", ["ppo", "dqn", "collect"])
def test_default_frame_counts_are_whole_batches(name: str) -> None:
    """The collector rounds (and warns about) counts that are not whole batches: the defaults
    a user runs first must not trigger that warning."""
    collector = config(name).collector
    for key in ("total_frames", "init_random_frames"):
        frames = collector.get(key) or 0
        assert frames % collector.frames_per_batch == 0, f"collector.{key}={frames}"


def test_dqn_config_errors_name_the_key(scripts: dict[str, ModuleType]) -> None:
    dqn = scripts["dqn"]
    with pytest.raises(dqn.ConfigError, match=r"^dqn.frames_per_update=0: expected a positive"):
        dqn.check_config(config("dqn", "dqn.frames_per_update=0"))
    with pytest.raises(dqn.ConfigError, match=r"^collector.total_frames=-1: DQN needs a finite"):
        dqn.check_config(config("dqn", "collector.total_frames=-1"))
    with pytest.raises(dqn.ConfigError, match=r"^replay_buffer: expected a config node"):
        dqn.check_config(config("dqn", "~replay_buffer._target_"))
    with pytest.raises(dqn.ConfigError, match=r"^dqn.learning_starts=1024 is more than the buf"):
        dqn.check_config(
            config("dqn", "replay_buffer.storage.max_size=512", "dqn.learning_starts=1024")
        )
    with pytest.raises(dqn.ConfigError, match=r"^collector.split_trajs=True: the replay buffer"):
        dqn.check_config(config("dqn", "collector.split_trajs=true"))
    with pytest.raises(dqn.ConfigError, match=r"^eval_every=-5: expected an int >= 0"):
        dqn.check_config(config("dqn", "eval_every=-5"))


def test_build_failures_name_the_key_and_target(scripts: dict[str, ModuleType]) -> None:
    from common.config import ConfigError, build, build_partial
    from common.env_info import probe_env

    cfg = config("ppo", "actor._target_=common.models.NoSuchActor")
    info = probe_env(build_partial(cfg, "env.make"))
    with pytest.raises(ConfigError, match=r"^actor: could not build common.models.NoSuchActor"):
        build(cfg, "actor", info=info)
    bad_env = config("ppo", "env=catch", "+env.make.no_such_argument=1")
    with pytest.raises(ConfigError, match=r"^env.make: could not build the env"):
        probe_env(build_partial(bad_env, "env.make"))


def test_every_env_config_builds_an_env_the_networks_accept(scripts: dict[str, ModuleType]) -> None:
    from common.config import build, build_partial
    from common.env_info import probe_env

    names = sorted(path.stem for path in (EXAMPLES / "conf" / "env").glob("*.yaml"))
    assert {"cartpole", "cartpole_batched", "pendulum", "catch", "catch_batched"} <= set(names)
    for name in names:
        cfg = config("ppo", f"env={name}")
        info = probe_env(build_partial(cfg, "env.make"))
        assert info.num_envs == cfg.env.get("num_envs", 1), name
        actor = build(cfg, "actor", info=info)
        observation = torch.zeros(3, *info.observation_shape, dtype=info.observation_dtype)
        action, log_prob = actor(observation)
        assert log_prob.shape == (3,), name
        assert action.shape[1:] == info.action_shape, name


def test_dqn_refuses_continuous_actions(scripts: dict[str, ModuleType]) -> None:
    from common.config import build_partial
    from common.env_info import probe_env

    dqn = scripts["dqn"]
    cfg = config("dqn", "env=pendulum")
    info = probe_env(build_partial(cfg, "env.make"))
    with pytest.raises(dqn.ConfigError, match=r"^env.id='Pendulum-v1' has continuous actions"):
        dqn.require_discrete(cfg, info)


@pytest.mark.parametrize("name", ["ppo", "dqn", "collect"])
def test_run_and_multirun_dirs_are_under_the_script_name(name: str) -> None:
    with initialize_config_dir(config_dir=str(EXAMPLES / "conf"), version_base=None):
        cfg = compose(config_name=name, return_hydra_config=True)
    assert cfg.hydra.run.dir.startswith(f"outputs/{name}/")
    assert cfg.hydra.sweep.dir.startswith(f"multirun/{name}/")


def test_resuming_checks_the_checkpoint_before_any_work(
    scripts: dict[str, ModuleType], tmp_path: Path
) -> None:
    from common.checkpoint import save_checkpoint
    from common.config import ConfigError, resume_state

    needed = ("actor", "critic", "optimizer", "collector")
    path = tmp_path / "checkpoint.pt"
    entries = {key: {} for key in needed}
    save_checkpoint(path, {"script": "ppo", "env_id": "CartPole-v1", "frames": 512, **entries})
    asked = config("ppo", f"resume={path}", "collector.total_frames=1024")
    assert resume_state(asked, "ppo", needed)["frames"] == 512
    with pytest.raises(ConfigError, match=r"written by ppo.py on CartPole-v1; this is ppo.py "):
        resume_state(config("ppo", f"resume={path}", "env=pendulum_batched"), "ppo", needed)
    with pytest.raises(ConfigError, match=r"lacks \['policy', 'target_network'\]; this is dqn.py"):
        resume_state(
            config("dqn", f"resume={path}", "collector.total_frames=1000"),
            "dqn",
            ("policy", "target_network", "optimizer", "collector"),
        )
    message = r"collector.total_frames=512: the checkpoint already has 512 frames, so this run"
    with pytest.raises(ConfigError, match=message + r".* collector.total_frames=1024"):
        resume_state(config("ppo", f"resume={path}", "collector.total_frames=512"), "ppo", needed)

"""The EnvPool env configs of the examples: collect.py and ppo.py on `env=cartpole_envpool`, and
`env=pong_envpool` read by CleanRL's Nature CNN."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from torch import nn

from tests.examples.script_runner import EXAMPLES, check_succeeded, run_script

pytest.importorskip("envpool")


def config(name: str, *overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(EXAMPLES / "conf"), version_base=None):
        return compose(config_name=name, overrides=list(overrides))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("no_leftover_children")
@pytest.mark.parametrize(
    ("script", "overrides", "printed"),
    [
        ("collect", ("collector.total_frames=256",), "frames/s (env CartPole-v1, batch (8,)"),
        ("ppo", ("env.num_envs=4", "collector.total_frames=128", "eval_episodes=1"), "greedy"),
    ],
)
def test_scripts_run_on_cartpole_envpool(
    tmp_path: Path, script: str, overrides: tuple[str, ...], printed: str
) -> None:
    result = run_script(
        script,
        tmp_path,
        "env=cartpole_envpool",
        "collector.frames_per_batch=64",
        "progress=false",
        *overrides,
        timeout=240,
    )
    check_succeeded(result)
    assert printed in result.stdout + result.stderr
    assert (tmp_path / "checkpoint.pt").is_file()


def test_pong_envpool_config_gets_cleanrl_nature_cnn(scripts: dict[str, ModuleType]) -> None:
    from common.config import build, validate
    from common.env_info import EnvInfo
    from common.models import NatureCNN

    cfg = config("ppo", "env=pong_envpool", "env.num_envs=2")
    validate(cfg, targets=["env.make", "collector", "actor", "critic"])
    # What probing the env gives (test_config.py probes every env config, this one included).
    info = EnvInfo("observation", (4, 84, 84), torch.uint8, 6, (), None, None, (2,))
    actor = build(cfg, "actor", info=info)
    critic = build(cfg, "critic", info=info)
    for network in (actor, critic):
        assert isinstance(network.encoder, NatureCNN)
        convolutions = [m for m in network.encoder.modules() if isinstance(m, nn.Conv2d)]
        layout = [(c.out_channels, c.kernel_size, c.stride) for c in convolutions]
        assert layout == [(32, (8, 8), (4, 4)), (64, (4, 4), (2, 2)), (64, (3, 3), (1, 1))]
        linear = network.encoder.head[0]
        assert (linear.in_features, linear.out_features) == (64 * 7 * 7, 512)
    frames = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    action, log_prob = actor(frames)
    assert action.shape == log_prob.shape == (2,)
    assert critic(frames).shape == (2, 1)


def test_an_unknown_envpool_id_names_the_key(scripts: dict[str, ModuleType]) -> None:
    from common.config import ConfigError, validate

    cfg = config("collect", "env=pong_envpool", "env.id=Pong-v9")
    with pytest.raises(ConfigError, match=r"^env.id='Pong-v9' is not an EnvPool task id"):
        validate(cfg, targets=["env.make", "collector"])

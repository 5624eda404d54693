"""The README's quickstart runs as written."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def section_code(heading: str = "## Quickstart") -> str:
    text = README.read_text()
    section = text.split(heading, 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, f"README has no python block under {heading!r}"
    return match.group(1)


def quickstart_code() -> str:
    return section_code()


def test_quickstart_is_short() -> None:
    assert len(quickstart_code().strip().splitlines()) <= 18


def test_quickstart_runs() -> None:
    namespace: dict[str, object] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # e.g. an action that misfits the spec
        exec(compile(quickstart_code(), str(README), "exec"), namespace)
    data = namespace["data"]
    assert data.batch_size == (4, 250)  # type: ignore[attr-defined]
    assert data.names == [None, "time"]  # type: ignore[attr-defined]
    assert len(namespace["buffer"]) == 5000  # type: ignore[arg-type]
    assert namespace["sample"].batch_size == (256,)  # type: ignore[attr-defined]


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
def test_multi_process_example_runs() -> None:
    namespace: dict[str, object] = {"__name__": "__main__"}
    code = section_code("## Multi-process collection")
    exec(compile(code, str(README), "exec"), namespace)
    assert namespace["data"].batch_size == (2, 500)  # type: ignore[attr-defined]
    assert namespace["collector"].policy_version == 4  # type: ignore[attr-defined]


def test_running_experiments_lists_every_config_and_how_to_activate() -> None:
    section = README.read_text().split("## Running experiments", 1)[1].split("\n## ", 1)[0]
    assert "source .venv/bin/activate" in section
    conf = README.parent / "examples" / "conf"
    for group in ("env", "collector"):
        for config in sorted((conf / group).glob("*.yaml")):
            assert f"`{config.stem}`" in section, f"{group}={config.stem} is not listed"
    assert "resume=" in section


def test_results_put_the_default_ppo_run_next_to_sb3() -> None:
    from omegaconf import OmegaConf

    heading = "### PPO on CartPole-v1 against Stable-Baselines3"
    section = README.read_text().split(heading, 1)[1].split("\n### ", 1)[0]
    assert "python benchmarks/ppo_vs_sb3.py" in section
    assert "2026-11-25" in section
    assert "| seeds 0-4 | frames to solve | seconds to solve | final greedy eval" in section
    assert "| rlcollect, `examples/ppo.py` |" in section
    assert "| SB3 PPO, RL Zoo hyperparameters |" in section
    # the defaults the section names are those of the config
    cfg = OmegaConf.load(README.parent / "examples" / "conf" / "ppo.yaml")
    text = " ".join(section.split())  # across line breaks
    assert f"{cfg.collector.total_frames:,} frames" in text
    assert f"{cfg.ppo.epochs} full-batch epochs" in text
    assert cfg.ppo.num_minibatches == 1
    assert f"gamma {cfg.gae.gamma} and lambda {cfg.gae.lmbda}" in text
    lr = f"{cfg.optim.lr:.0e}".replace("e-0", "e-")  # 3e-3
    assert f"learning rate {lr} and clip range {cfg.ppo.clip_epsilon}" in text

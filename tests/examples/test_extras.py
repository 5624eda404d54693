"""Options whose extra is missing stop the example scripts at start-up (issue 32): before Hydra
makes a run dir, naming the option, the module, the extra and the rlc.sh job that installs
everything; a config that needs no extra is not refused.

The script tests run the real scripts (in children of the script zygote, as `python
examples/<script>.py` runs them) with imports blocked by a blocker the child runs first, as a
`sitecustomize` would run at start-up: a blocked module (and its submodules) raises
ModuleNotFoundError, and namespace packages (Hydra's `hydra_plugins`) no longer list it, as when
it is not installed. The zygote has imported torch, tensordict, Gymnasium, Hydra and rlcollect,
none of which imports an optional module; the blocker refuses to run if one was imported."""

from __future__ import annotations

import os
import re
import subprocess
from importlib import metadata
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.examples.script_runner import EXAMPLES, REPO_ROOT, check_succeeded, zygote

BLOCKER = '''"""Blocks the modules named in RLC_BLOCKED_MODULES (comma-separated)."""
import os
import pkgutil
import sys
from importlib.abc import MetaPathFinder

BLOCKED = [name for name in os.environ.get("RLC_BLOCKED_MODULES", "").split(",") if name]


def blocked(name):
    return any(name == module or name.startswith(module + ".") for module in BLOCKED)


# Too late to block what was imported already: the run would not show a missing module.
imported = sorted(name for name in sys.modules if blocked(name))
if imported:
    raise RuntimeError(f"blocked modules {imported} were imported before the blocker ran")


class Blocker(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if blocked(name):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Blocker())
listed = pkgutil.iter_modules
pkgutil.iter_modules = lambda *args, **kwargs: (
    module for module in listed(*args, **kwargs) if not blocked(module.name)
)
'''


@pytest.fixture(scope="module")
def blocker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The import blocker, as a file."""
    path = tmp_path_factory.mktemp("blocker") / "block_imports.py"
    path.write_text(BLOCKER)
    return path


def run_without(
    blocker: Path, blocked: tuple[str, ...], script: str, *arguments: str
) -> subprocess.CompletedProcess[str]:
    """`python examples/<script>.py <arguments>` with the `blocked` modules not importable."""
    environment = {**os.environ, "RLC_BLOCKED_MODULES": ",".join(blocked), "PYTHONUNBUFFERED": "1"}
    argv = [str(EXAMPLES / f"{script}.py"), *arguments]
    return zygote().run(argv, environment, timeout=150, before=blocker)


# One run per option group: (script, flags and overrides, blocked modules, what the message
# must name: each option and the extra). {run_dir} is where Hydra would write the run.
REFUSED = {
    "video": (
        "ppo",
        ("hydra.run.dir={run_dir}", "video.enabled=true"),
        ("moviepy",),
        ("video.enabled=true needs moviepy",),
        "video",
    ),
    "logger": (
        "ppo_rollout_buffer",
        ("--multirun", "hydra.sweep.dir={run_dir}", "logger=csv,tensorboard,wandb,mlflow"),
        ("tensorboard", "wandb", "mlflow"),
        ("logger=tensorboard needs tensorboard", "logger=wandb needs", "logger=mlflow needs"),
        "logging",
    ),
    "sweep": (
        "ppo",
        ("--multirun", "hydra.sweep.dir={run_dir}", "+sweep=ppo_optuna"),
        ("hydra_plugins.hydra_optuna_sweeper",),
        ("hydra/sweeper=optuna needs hydra_plugins.hydra_optuna_sweeper",),
        "sweep",
    ),
    "env=cartpole_envpool": (
        "collect",
        ("hydra.run.dir={run_dir}", "env=cartpole_envpool"),
        ("envpool",),
        ("env=cartpole_envpool needs envpool",),
        "envpool",
    ),
    "env.id=MuJoCo": (
        "sac",
        ("hydra.run.dir={run_dir}", "env.id=HalfCheetah-v5"),
        ("mujoco",),
        ("env.id=HalfCheetah-v5 (a MuJoCo env) needs mujoco",),
        "mujoco",
    ),
    "env=PettingZoo": (
        "mappo",
        ("hydra.run.dir={run_dir}",),
        ("pettingzoo", "mpe2"),
        ("PettingZooEnv needs pettingzoo", "mpe2.simple_spread_v3.parallel_env needs mpe2"),
        "pettingzoo",
    ),
    "collector and replay_buffer=ray": (
        "dqn",
        ("hydra.run.dir={run_dir}", "collector=ray", "replay_buffer=ray"),
        ("ray",),
        ("collector=ray and replay_buffer=ray need ray",),
        "ray",
    ),
}


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("no_leftover_children")
@pytest.mark.parametrize("group", list(REFUSED))
def test_option_whose_extra_is_missing_stops_the_script_at_start_up(
    tmp_path: Path, blocker: Path, group: str
) -> None:
    script, arguments, blocked, named, extra = REFUSED[group]
    run_dir = tmp_path / "run"
    result = run_without(blocker, blocked, script, *(a.format(run_dir=run_dir) for a in arguments))
    assert result.returncode == 1, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.stderr.startswith("missing extra: this run's options need modules"), result.stderr
    for words in named:
        assert words in result.stderr, result.stderr
    assert f'from the "{extra}" extra' in result.stderr
    assert f'pip install -e ".[{extra}]"' in result.stderr
    assert "bash scripts/rlc.sh test" in result.stderr
    assert "Traceback" not in result.stderr
    # Before Hydra: no run dir, so no metrics, checkpoint or progress of any training.
    assert not run_dir.exists(), sorted(run_dir.rglob("*"))


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("no_leftover_children", "scripts")
def test_config_that_needs_no_extra_trains_with_every_optional_module_blocked(
    tmp_path: Path, blocker: Path
) -> None:
    from common.extras import EXTRA_OF_MODULE

    optional = tuple(module for module, extra in EXTRA_OF_MODULE.items() if extra != "examples")
    result = run_without(
        blocker,
        optional,
        "ppo",
        f"hydra.run.dir={tmp_path}",
        "env.num_envs=4",
        "collector.frames_per_batch=128",
        "collector.total_frames=256",
        "eval_episodes=1",
        "progress=false",
    )
    check_succeeded(result)
    assert "missing extra" not in result.stderr
    assert (tmp_path / "metrics.csv").is_file()


# --- in process: the table against pyproject.toml and rlc.sh, and every config option ---

# What each option of examples/conf needs besides the examples extra (matplotlib); a file
# not listed needs nothing. Which script composes each group.
NEEDS = {
    "env/cartpole_envpool": {"envpool"},
    "env/pong_envpool": {"envpool"},
    "logger/tensorboard": {"tensorboard"},
    "logger/wandb": {"wandb"},
    "logger/mlflow": {"mlflow"},
    "collector/ray": {"ray"},
    "replay_buffer/ray": {"ray"},
    "sweep/ppo_optuna": {"hydra_plugins.hydra_optuna_sweeper", "optuna"},
}
SCRIPT_OF_GROUP = {"replay_buffer": "dqn"}


def needed_modules(config_name: str, *arguments: str) -> set[str]:
    """The optional modules the runs of `arguments` need (matplotlib, which every run
    needs, left out)."""
    from common.command_line import composed_runs
    from common.extras import config_needs

    modules = set()
    for run in composed_runs(config_name, arguments):
        choices = OmegaConf.select(run, "hydra.runtime.choices", default=None) or {}
        job = OmegaConf.masked_copy(run, [str(key) for key in run if key != "hydra"])
        modules |= {need.module for need in config_needs(job, choices)}
    return modules - {"matplotlib"}


@pytest.mark.usefixtures("scripts")
@pytest.mark.parametrize(
    "option",
    sorted(
        f"{path.parent.name}/{path.stem}"
        for path in (EXAMPLES / "conf").glob("*/*.yaml")
        if path.parent.name != "hydra"
    ),
)
def test_every_config_option_names_the_modules_it_needs(option: str) -> None:
    group, name = option.split("/")
    override = f"+{group}={name}" if group == "sweep" else f"{group}={name}"
    assert needed_modules(SCRIPT_OF_GROUP.get(group, "ppo"), override) == NEEDS.get(option, set())


@pytest.mark.usefixtures("scripts")
def test_settings_that_need_an_extra_outside_the_config_groups() -> None:
    assert needed_modules("ppo") == set()
    assert needed_modules("ppo", "video.enabled=true") == {"moviepy"}
    assert needed_modules("mappo") == {"pettingzoo", "mpe2"}
    assert needed_modules("sac", "env.id=HalfCheetah-v5") == {"mujoco"}
    # EnvPool ships its own MuJoCo: the Gymnasium one is not needed there.
    assert needed_modules("ppo", "env=cartpole_envpool", "env.id=HalfCheetah-v4") == {"envpool"}
    # An override of a target counts as much as a config file.
    assert needed_modules("ppo", "logger._target_=common.loggers.WandbLogger") == {"wandb"}


@pytest.mark.usefixtures("scripts")
def test_every_choice_of_a_sweep_is_checked_and_flags_without_a_run_are_not() -> None:
    assert needed_modules("ppo", "--multirun", "logger=csv,wandb", "optim.lr=1e-3,3e-3") == {
        "wandb"
    }
    assert needed_modules("ppo", "-m", "video.enabled=false,true") == {"moviepy"}
    # The sweeper's own parameters (conf/sweep/ppo_optuna.yaml sweeps numbers only).
    params = "+hydra.sweeper.params.logger='choice(csv,mlflow)'"
    assert needed_modules("ppo", "-m", "+sweep=ppo_optuna", params) == {
        "hydra_plugins.hydra_optuna_sweeper",
        "optuna",
        "mlflow",
    }
    assert needed_modules("dqn", "--config-name", "ppo", "logger=wandb") == {"wandb"}
    for flags in (("--help",), ("--cfg", "job"), ("--config-dir", "elsewhere")):
        assert needed_modules("ppo", *flags, "logger=wandb") == set()


@pytest.mark.usefixtures("scripts")
def test_message_names_each_option_the_extras_and_what_to_run_instead() -> None:
    from common.extras import Need, missing_message

    message = missing_message(
        [
            (Need("collector=ray", "ray", "collector=single"), "ModuleNotFoundError: ray"),
            (Need("replay_buffer=ray", "ray", "replay_buffer=local"), "ModuleNotFoundError: ray"),
            (Need("logger=wandb", "wandb", "logger=csv"), "ModuleNotFoundError: wandb"),
        ]
    )
    assert message == (
        "missing extra: this run's options need modules that are not installed:\n"
        '  collector=ray and replay_buffer=ray need ray, from the "ray" extra '
        "(ModuleNotFoundError: ray)\n"
        '  logger=wandb needs wandb, from the "logging" extra (ModuleNotFoundError: wandb)\n'
        'Install with pip install -e ".[ray,logging]", or every extra with bash scripts/rlc.sh '
        "test (which then runs the tests); or run without: collector=single; "
        "replay_buffer=local; logger=csv."
    )


def distributions_of_extra(extra: str) -> set[str]:
    """The distributions rlcollect's `extra` (pyproject.toml's, as installed) brings: its
    requirements and theirs (with the extras it asks of them), one level down."""
    names = set()
    for requirement in map(Requirement, metadata.requires("rlcollect") or []):
        if requirement.marker is None or not requirement.marker.evaluate({"extra": extra}):
            continue
        names.add(canonicalize_name(requirement.name))
        for dependency in map(Requirement, metadata.requires(requirement.name) or []):
            wanted = requirement.extras or {""}
            if dependency.marker is None or any(
                dependency.marker.evaluate({"extra": name}) for name in wanted
            ):
                names.add(canonicalize_name(dependency.name))
    return names


@pytest.mark.usefixtures("scripts")
def test_each_module_comes_with_the_extra_named_for_it_and_rlc_sh_test_installs_them() -> None:
    from common.extras import EXTRA_OF_MODULE

    providers = metadata.packages_distributions()
    for module, extra in EXTRA_OF_MODULE.items():
        provided_by = {canonicalize_name(name) for name in providers[module.split(".")[0]]}
        assert provided_by & distributions_of_extra(extra), (module, extra)
    rlc = (REPO_ROOT / "scripts" / "rlc.sh").read_text()
    installed = re.search(r"^\s*test\) setup ([\w,]+);", rlc, re.MULTILINE)
    assert installed is not None, "scripts/rlc.sh has no test job that runs setup"
    assert set(EXTRA_OF_MODULE.values()) <= set(installed[1].split(","))


def test_scripts_check_extras_before_hydra_starts() -> None:
    for path in sorted(EXAMPLES.glob("*.py")):
        text = path.read_text()
        name = re.search(r'config_name=(\w+|"\w+")', text)
        assert name is not None, path
        assert f"    check_extras({name[1]}, sys.argv[1:])\n    main()" in text, path

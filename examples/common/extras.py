"""`check_extras`: before Hydra starts, stop a run whose options need a package that is not
installed, naming the option, the module and the extra of pyproject.toml that brings it."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from .command_line import composed_runs

# Every optional module the examples import, and the extra of pyproject.toml that installs it
# (tests/examples/test_extras.py checks this table against pyproject.toml and scripts/rlc.sh).
EXTRA_OF_MODULE: dict[str, str] = {
    "matplotlib": "examples",
    "moviepy": "video",
    "tensorboard": "logging",
    "wandb": "logging",
    "mlflow": "logging",
    "hydra_plugins.hydra_optuna_sweeper": "sweep",
    "optuna": "sweep",
    "envpool": "envpool",
    "mujoco": "mujoco",
    "pettingzoo": "pettingzoo",
    "mpe2": "pettingzoo",
    "ray": "ray",
}

INSTALL_EVERYTHING = "bash scripts/rlc.sh test"  # its setup installs every extra above

# What a `_target_` needs, by the prefix of the built object's `module.qualname`, and what to
# pick instead. Targets outside rlcollect and the examples need their top-level package when
# it is an optional module (`mpe2.simple_spread_v3.parallel_env` needs mpe2).
TARGET_NEEDS: tuple[tuple[str, tuple[str, ...], str | None], ...] = (
    ("rlcollect.envs.envpool", ("envpool",), "a Gymnasium env, e.g. env=cartpole_batched"),
    ("rlcollect.envs.pettingzoo", ("pettingzoo",), None),
    ("rlcollect.collectors.ray", ("ray",), "collector=single or collector=multisync"),
    ("rlcollect.collectors.weights.ray", ("ray",), None),
    ("rlcollect.replay.ray", ("ray",), "replay_buffer=local"),
    ("common.loggers.TensorBoardLogger", ("tensorboard",), "logger=csv"),
    ("common.loggers.WandbLogger", ("wandb",), "logger=csv"),
    ("common.loggers.MlflowLogger", ("mlflow",), "logger=csv"),
)
LOCAL_PACKAGES = ("rlcollect", "common")  # always importable: resolve them to match a prefix

SWEEPERS: dict[str, tuple[str, ...]] = {"optuna": ("hydra_plugins.hydra_optuna_sweeper", "optuna")}
MUJOCO_ENTRY_POINT = "gymnasium.envs.mujoco"


@dataclass(frozen=True)
class Need:
    """One optional module a run's option imports.

    Args:
        option: the option as the command line sets it, e.g. `logger=wandb`.
        module: the module it imports, a key of `EXTRA_OF_MODULE`.
        instead: an option that needs no extra, to name in the message (None: none).
    """

    option: str
    module: str
    instead: str | None = None

    @property
    def extra(self) -> str:
        """The extra of pyproject.toml that installs the module."""
        return EXTRA_OF_MODULE[self.module]


def _targets(node: Any, path: str) -> Iterator[tuple[str, str]]:
    """`(key, _target_)` of every node with a `_target_` under `node` (a plain container)."""
    if isinstance(node, Mapping):
        target = node.get("_target_")
        if isinstance(target, str):
            yield path, target
        for name, child in node.items():
            yield from _targets(child, f"{path}.{name}" if path else str(name))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from _targets(child, f"{path}[{index}]")


def _qualified_name(target: str) -> str:
    """`module.qualname` of a local target (`rlcollect.envs.EnvPoolEnv` ->
    `rlcollect.envs.envpool_env.EnvPoolEnv`); the target as written when it cannot be
    imported (a bad target is reported by name when the run builds it)."""
    from hydra.utils import get_object

    try:
        built = get_object(target)
    except Exception:
        return target
    return f"{getattr(built, '__module__', '')}.{getattr(built, '__qualname__', '')}"


def target_needs(target: str) -> tuple[tuple[str, ...], str | None]:
    """The optional modules building `target` imports, and an option to pick instead."""
    package = target.split(".", 1)[0]
    if package not in LOCAL_PACKAGES:
        return ((package,) if package in EXTRA_OF_MODULE else ()), None
    name = _qualified_name(target)
    for prefix, modules, instead in TARGET_NEEDS:
        if name.startswith(prefix):
            return modules, instead
    return (), None


def _option(key: str, target: str, choices: Mapping[str, Any]) -> str:
    """How the command line picks the target at `key`: its config group's choice when the key
    is in one (`env=cartpole_envpool`), else the key itself."""
    group = key.split(".", 1)[0]
    choice = choices.get(group)
    return f"{group}={choice}" if isinstance(choice, str) else f"{key}._target_={target}"


def _mujoco_id(env_id: Any) -> bool:
    """Whether `env_id` is a Gymnasium MuJoCo env (registered with or without mujoco)."""
    import gymnasium as gym

    if not isinstance(env_id, str) or ":" in env_id:
        return False
    try:
        entry_point = gym.spec(env_id).entry_point
    except gym.error.Error:
        return False
    return isinstance(entry_point, str) and entry_point.startswith(MUJOCO_ENTRY_POINT)


def _setting(cfg: DictConfig, key: str) -> Any:
    """The value at `key`; None when it is missing or does not resolve (the run's own
    checks name the key)."""
    return OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)


def config_needs(cfg: DictConfig, choices: Mapping[str, Any]) -> list[Need]:
    """The optional modules a run of `cfg` (the job's config, without `hydra`) imports,
    whatever the run does first; `choices` are Hydra's config group choices
    (`hydra.runtime.choices`), which name the options."""
    needs = [Need("every run (its return.png)", "matplotlib")]
    sweeper = choices.get("hydra/sweeper")
    needs += [
        Need(f"hydra/sweeper={sweeper}", module, "no sweep, or Hydra's basic sweeper")
        for module in SWEEPERS.get(str(sweeper), ())
    ]
    if _setting(cfg, "video.enabled") is True:
        needs.append(Need("video.enabled=true", "moviepy", "video.enabled=false"))
    runs_on_envpool = False
    # Unresolved: a node that copies another (`make_single: ${env.make.create_env_fn}`) is
    # counted once, where it is written.
    for key, target in _targets(OmegaConf.to_container(cfg, resolve=False), ""):
        modules, instead = target_needs(target)
        runs_on_envpool = runs_on_envpool or "envpool" in modules
        needs += [Need(_option(key, target, choices), module, instead) for module in modules]
    env_id = _setting(cfg, "env.id")
    if not runs_on_envpool and _mujoco_id(env_id):
        needs.append(
            Need(
                f"env.id={env_id} (a MuJoCo env)",
                "mujoco",
                "a classic-control env, e.g. env=pendulum",
            )
        )
    return needs


def import_error(module: str) -> str | None:
    """Why `module` cannot be imported (`ModuleNotFoundError: ...`), or None when it can."""
    try:
        importlib.import_module(module)
    except Exception as err:  # a broken install stops the run as surely as a missing one
        return f"{type(err).__name__}: {err}"
    return None


def missing_message(missing: Sequence[tuple[Need, str]]) -> str:
    """What to say about the `(need, import error)` pairs: the options that need each missing
    module and its extra, then one pip command for all, the rlc.sh job that installs every
    extra, and the options to pick instead."""
    options: dict[str, list[str]] = {}
    for need, _ in missing:
        options.setdefault(need.module, []).append(need.option)
    lines = ["missing extra: this run's options need modules that are not installed:"]
    for need, error in missing:
        named = options[need.module]
        if need.option == named[0]:
            verb = "needs" if len(named) == 1 else "need"
            lines.append(
                f'  {" and ".join(named)} {verb} {need.module}, from the "{need.extra}" extra '
                f"({error})"
            )
    extras = ",".join(dict.fromkeys(need.extra for need, _ in missing))
    instead = "; ".join(dict.fromkeys(need.instead for need, _ in missing if need.instead))
    lines.append(
        f'Install with pip install -e ".[{extras}]", or every extra with {INSTALL_EVERYTHING} '
        "(which then runs the tests)" + (f"; or run without: {instead}." if instead else ".")
    )
    return "\n".join(lines)


def check_needs(needs: Sequence[Need]) -> None:
    """Import each module of `needs` once.

    Raises:
        SystemExit: `missing extra: ...` naming every option whose module is missing.
    """
    errors = {module: import_error(module) for module in dict.fromkeys(n.module for n in needs)}
    missing = [(need, error) for need in needs if (error := errors[need.module]) is not None]
    if missing:
        raise SystemExit(missing_message(missing))


def check_extras(config_name: str, arguments: Sequence[str]) -> None:
    """Before Hydra starts (and so before any env, collector or training): the runs the
    command line asks for (`arguments`: Hydra's flags and overrides; a sweep's every choice)
    must find the optional modules their options import.

    Raises:
        SystemExit: `missing extra: <option> needs <module> (...), from the "<extra>"
            extra`, with the pip command and the rlc.sh job that installs it.
    """
    needs: list[Need] = []
    for run in composed_runs(config_name, arguments):
        choices = OmegaConf.select(run, "hydra.runtime.choices", default=None) or {}
        job = OmegaConf.masked_copy(run, [str(key) for key in run if key != "hydra"])
        needs += config_needs(job, choices)
    check_needs(list(dict.fromkeys(needs)))

"""`composed_runs`: the configs an example's command line asks Hydra to run, composed before
Hydra starts (one per choice of a sweep), for checks that must come before any work."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, ValueType
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf

from .config import CONFIG_DIR

MULTIRUN_FLAGS = ("--multirun", "-m")
CONFIG_NAME_FLAGS = ("--config-name", "-cn")
CHOICE_SWEEPS = (ValueType.CHOICE_SWEEP, ValueType.SIMPLE_CHOICE_SWEEP)
# A config group option that a Hydra plugin registers (`hydra/sweeper/optuna`) is missing
# when the plugin is not installed.
MISSING_HYDRA_OPTION = re.compile(r"Could not find '(hydra/[\w-]+)/([\w-]+)'")


def split_command_line(config_name: str, arguments: Sequence[str]) -> tuple[str, list[str]] | None:
    """The config name and the overrides of a script's `arguments`, or None when they hold a
    Hydra flag other than `--multirun` and `--config-name` (`--help`, `--cfg job`,
    `--config-dir`, ...): no run, or a config from elsewhere, which Hydra handles alone."""
    overrides = []
    rest = iter(arguments)
    for argument in rest:
        flag, equals, value = argument.partition("=")
        if argument in MULTIRUN_FLAGS:
            continue
        if flag in CONFIG_NAME_FLAGS:
            config_name = value if equals else next(rest, config_name)
        elif argument.startswith("-"):
            return None
        else:
            overrides.append(argument)
    return config_name, overrides


def choice_overrides(sweeps: Iterable[Override]) -> list[str]:
    """`key=value` for every value of every choice sweep in `sweeps` (`logger=csv,wandb` ->
    `logger=csv`, `logger=wandb`); ranges and intervals sweep numbers, not options."""
    return [
        f"{sweep.get_key_element()}={value}"
        for sweep in sweeps
        if sweep.is_sweep_override() and sweep.value_type in CHOICE_SWEEPS
        for value in sweep.sweep_string_iterator()
    ]


def compose_or_none(config_name: str, overrides: list[str]) -> DictConfig | None:
    """The config of one run, Hydra's own node included (`hydra.runtime.choices`). A Hydra
    option that an uninstalled plugin registers gives a config holding only that choice;
    any other error gives None (Hydra reports it when it composes the run)."""
    try:
        return compose(config_name, overrides=overrides, return_hydra_config=True)
    except MissingConfigException as err:
        found = MISSING_HYDRA_OPTION.search(str(err))
        if found is None:
            return None
        return OmegaConf.create({"hydra": {"runtime": {"choices": {found[1]: found[2]}}}})
    except Exception:
        return None


def sweeper_params(parser: OverridesParser, run: DictConfig) -> list[Override]:
    """The sweeper's parameters in `run` (`hydra.sweeper.params`) as overrides; none when
    they do not parse (the sweeper says why)."""
    params = OmegaConf.select(
        run, "hydra.sweeper.params", default=None, throw_on_resolution_failure=False
    )
    if not isinstance(params, DictConfig):
        return []
    lines = [f"{key}={value}" for key, value in params.items_ex(resolve=False)]
    try:
        return parser.parse_overrides(lines)
    except HydraException:
        return []


def composed_runs(config_name: str, arguments: Sequence[str]) -> list[DictConfig]:
    """The configs `arguments` (Hydra's command line after the script) compose: the run
    itself, then one per value of each choice sweep, from the command line or the config's
    `hydra.sweeper.params`. Empty when Hydra's flags ask for no run or the overrides do not
    parse (Hydra then says why)."""
    split = split_command_line(config_name, arguments)
    if split is None:
        return []
    config_name, overrides = split
    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(overrides)
    except HydraException:
        return []
    fixed = [override.input_line or "" for override in parsed if not override.is_sweep_override()]
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        run = compose_or_none(config_name, fixed)
        if run is None:
            return []
        parsed += sweeper_params(parser, run)
        sweeps = (compose_or_none(config_name, [*fixed, o]) for o in choice_overrides(parsed))
        return [run, *(sweep for sweep in sweeps if sweep is not None)]

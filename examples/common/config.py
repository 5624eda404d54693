"""Up-front config checks and `build`, which instantiates a config node naming its key on error."""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
from hydra.utils import get_object, instantiate, to_absolute_path
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """A config value is wrong; the message starts with the config key to fix."""


def value_at(cfg: DictConfig, key: str) -> Any:
    """The value at a dotted `key`, or a ConfigError naming the key when it is missing."""
    missing = object()
    value = OmegaConf.select(cfg, key, default=missing)
    if value is missing:
        raise ConfigError(f"{key}: the config has no such key; add it, e.g. +{key}=<value>.")
    return value


def require_target(cfg: DictConfig, key: str) -> None:
    """Check that the node at `key` is a mapping with a `_target_`."""
    node = value_at(cfg, key)
    if not isinstance(node, DictConfig) or "_target_" not in node:
        raise ConfigError(
            f"{key}: expected a config node with a _target_ (the class or function to build), "
            f"got {OmegaConf.to_yaml(node).strip() if isinstance(node, DictConfig) else node!r}."
            f" Add one, e.g. {key}._target_=<module.Class>, or pick a file of its config group."
        )


def _accepted_arguments(target: Any) -> dict[str, inspect.Parameter] | None:
    """The keyword arguments `target` takes (None: it takes any). A multi-process or Ray
    collector passes its extra options to the collector each worker builds, and the examples'
    batched collector its own to `AsyncBatchedCollector`, so those count too."""
    try:
        # A class's __init__: `Collector.__new__` is the front door and takes anything.
        init = target.__init__ if isinstance(target, type) else target
        parameters = dict(inspect.signature(init).parameters)
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        from rlcollect.collectors import AsyncBatchedCollector, Collector, RayCollector
        from rlcollect.collectors.multiprocess.base import MultiCollectorBase

        if not isinstance(target, type):
            return None
        if issubclass(target, MultiCollectorBase):
            sources: tuple[type, ...] = (MultiCollectorBase, Collector)
        elif issubclass(target, RayCollector):
            sources = (Collector,)
        elif issubclass(target, AsyncBatchedCollector):  # collector=batched's wrapper
            sources = (AsyncBatchedCollector,)
        else:
            return None
        for source in sources:
            parameters = {**inspect.signature(source.__init__).parameters, **parameters}
    return {
        name: p for name, p in parameters.items() if p.kind is not p.VAR_KEYWORD and name != "self"
    }


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_target_arguments(cfg: DictConfig, key: str) -> None:
    """Check the node at `key` (and its nested `_target_` nodes) against its target's
    signature: every key must be an argument (a misspelling gets the closest name), and a
    number argument must not be given a string.

    Raises:
        ConfigError: naming the key, the target and what would be accepted.
    """
    node = value_at(cfg, key)
    try:
        target = get_object(node["_target_"])
    except Exception as err:
        raise ConfigError(f"{key}._target_={node['_target_']!r} cannot be imported: {err}") from err
    accepted = _accepted_arguments(target)
    for name in node:
        name = str(name)
        if name.startswith("_"):
            continue
        value = OmegaConf.select(node, name)
        if isinstance(value, DictConfig) and "_target_" in value:
            check_target_arguments(cfg, f"{key}.{name}")
        if accepted is None:
            continue
        if name not in accepted:
            close = difflib.get_close_matches(name, list(accepted), n=1)
            hint = f" Did you mean {key}.{close[0]}?" if close else ""
            raise ConfigError(f"{key}.{name}: {node['_target_']} takes no argument {name!r}.{hint}")
        default = accepted[name].default
        if _is_number(default) and not _is_number(value) and value is not None:
            raise ConfigError(
                f"{key}.{name}={value!r}: expected a number (like its default, {default!r})."
            )


def require_positive_int(cfg: DictConfig, key: str, *, allow_endless: bool = False) -> None:
    """Check that `key` holds an int > 0 (or -1, meaning endless, when `allow_endless`)."""
    value = value_at(cfg, key)
    endless = allow_endless and value == -1
    if isinstance(value, bool) or not isinstance(value, int) or (value <= 0 and not endless):
        hint = " or -1 (endless)" if allow_endless else ""
        raise ConfigError(f"{key}={value!r}: expected a positive int{hint}, e.g. {key}=1000.")


def require_nonnegative_int(cfg: DictConfig, key: str) -> None:
    """Check that `key` holds an int >= 0 (a seed, or a period where 0 means never)."""
    value = value_at(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{key}={value!r}: expected an int >= 0, e.g. {key}=0.")


def require_bool(cfg: DictConfig, key: str) -> None:
    """Check that `key` holds true or false."""
    value = value_at(cfg, key)
    if not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r}: expected true or false.")


def require_positive_number(cfg: DictConfig, key: str) -> None:
    """Check that `key` holds a number > 0."""
    value = value_at(cfg, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{key}={value!r}: expected a number > 0.")


def refuse_collector_option(cfg: DictConfig, key: str, why: str) -> None:
    """Refuse a collector option the script's training cannot use, when it is set."""
    value = OmegaConf.select(cfg, key, default=None)
    if value not in (None, False, 0, -1):
        raise ConfigError(f"{key}={value!r}: {why}")


def require_fraction(cfg: DictConfig, key: str) -> None:
    """Check that `key` holds a number in [0, 1]."""
    value = value_at(cfg, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ConfigError(f"{key}={value!r}: expected a number in [0, 1].")


ENVPOOL_TARGET = "rlcollect.envs.EnvPoolEnv"


def require_envpool_id(key: str, env_id: object) -> None:
    """Check that `env_id` is an EnvPool task id (EnvPool is an optional extra)."""
    try:
        import envpool
    except ImportError as err:
        raise ConfigError(
            f"{key}={env_id!r}: this env runs on EnvPool, which is not installed; install it "
            "with pip install 'rlcollect[envpool]'."
        ) from err
    if env_id not in envpool.list_all_envs():
        raise ConfigError(
            f"{key}={env_id!r} is not an EnvPool task id; envpool.list_all_envs() lists them "
            "(e.g. CartPole-v1, Pong-v5)."
        )


def require_gym_id(cfg: DictConfig, key: str = "env.id") -> None:
    """Check that `key` names a registered Gymnasium env (`"module:Id"` imports the module), or
    an EnvPool task when the env is made by `EnvPoolEnv`."""
    env_id = value_at(cfg, key)
    if OmegaConf.select(cfg, "env.make._target_", default=None) == ENVPOOL_TARGET:
        require_envpool_id(key, env_id)
        return
    if not isinstance(env_id, str):
        raise ConfigError(f"{key}={env_id!r}: expected a Gymnasium id string such as CartPole-v1.")
    module, _, name = env_id.rpartition(":")
    try:
        if module:
            importlib.import_module(module)
        gym.spec(name)
    except (gym.error.Error, ImportError) as err:
        raise ConfigError(
            f"{key}={env_id!r} is not a registered Gymnasium env ({err}). Check the spelling "
            "and version suffix, e.g. env.id=CartPole-v1."
        ) from err


def resume_path(cfg: DictConfig) -> Path | None:
    """The absolute checkpoint path of `resume`, checked to exist, or None."""
    path = value_at(cfg, "resume")
    if path is None:
        return None
    resolved = Path(to_absolute_path(str(path)))
    if not resolved.is_file():
        raise ConfigError(
            f"resume={path!r}: no checkpoint file there; pass the path of a checkpoint.pt "
            "written by an earlier run, or resume=null."
        )
    return resolved


def checkpoint_identity(cfg: DictConfig, script: str) -> dict[str, str]:
    """What a checkpoint records of the run that wrote it, so a resume can be checked."""
    return {"script": script, "env_id": str(cfg.env.id)}


def resume_state(cfg: DictConfig, script: str, needed: Iterable[str]) -> dict[str, Any]:
    """The checkpoint to resume from (`{}` without `resume`), checked before any work: it
    was written by this script on this env (checkpoints name both), holds the `needed`
    entries, and `collector.total_frames` asks for more frames than it has.

    Raises:
        ConfigError: naming what wrote the checkpoint and what was asked now.
    """
    path = resume_path(cfg)
    if path is None:
        return {}
    from common.checkpoint import load_checkpoint

    state = load_checkpoint(path)
    # Checkpoints of earlier versions do not say what wrote them; their entries still tell.
    written_by = state.get("script")
    written_on = state.get("env_id", str(cfg.env.id))
    missing = sorted(set(needed) - set(state))
    if missing or written_by not in (None, script) or written_on != str(cfg.env.id):
        writer = f"{written_by}.py" if written_by else "an earlier run"
        raise ConfigError(
            f"resume={str(path)!r}: the checkpoint was written by {writer} on {written_on}"
            f"{f' and lacks {missing}' if missing else ''}; this is {script}.py with "
            f"env.id={cfg.env.id}. Resume it with the script and env that wrote it."
        )
    frames, total = int(state["frames"]), int(cfg.collector.total_frames)
    if total != -1 and total <= frames:
        raise ConfigError(
            f"collector.total_frames={total}: the checkpoint already has {frames} frames, so "
            f"this run is complete. Ask for more to continue it, e.g. "
            f"collector.total_frames={2 * frames}."
        )
    return state


def validate(
    cfg: DictConfig,
    *,
    targets: Iterable[str],
    positive_ints: Iterable[str] = (),
    nonnegative_ints: Iterable[str] = (),
    fractions: Iterable[str] = (),
    positive_numbers: Iterable[str] = (),
) -> None:
    """Run the common checks of an example's config before any work starts.

    Every value is resolved first (a broken interpolation names its key), then the nodes in
    `targets` must have a `_target_`, `env.id` must be registered, the keys in `positive_ints`
    must be positive ints and `collector.total_frames` positive or -1; `seed` and
    `checkpoint_every` are ints >= 0 and `progress` a bool, in every script.

    Raises:
        ConfigError: the first problem found, naming its config key.
    """
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "config"
        raise ConfigError(f"{key}: {err}") from err
    for key in targets:
        require_target(cfg, key)
        check_target_arguments(cfg, key)
    require_gym_id(cfg)
    require_positive_int(cfg, "collector.frames_per_batch")
    require_positive_int(cfg, "collector.total_frames", allow_endless=True)
    for key in positive_ints:
        require_positive_int(cfg, key)
    for key in ["seed", "checkpoint_every", *nonnegative_ints]:
        require_nonnegative_int(cfg, key)
    require_bool(cfg, "progress")
    for key in fractions:
        require_fraction(cfg, key)
    for key in positive_numbers:
        require_positive_number(cfg, key)
    resume_path(cfg)


def build(cfg: DictConfig, key: str, **objects: Any) -> Any:
    """Instantiate the node at `key`, passing `objects` (modules, envs, ...) as keyword args.

    The node is first turned into a partial (so `objects` are passed as they are, never
    copied into the config), then called.

    Raises:
        ConfigError: naming `key` and its `_target_` when building fails.
    """
    require_target(cfg, key)
    node = value_at(cfg, key)
    try:
        factory = instantiate(node, _partial_=True)
        return factory(**objects)
    except Exception as err:
        raise ConfigError(
            f"{key}: could not build {node.get('_target_')} from the config: {err}"
        ) from err


def build_partial(cfg: DictConfig, key: str) -> Any:
    """The node at `key` as a `functools.partial` (e.g. an env factory), naming `key` on error."""
    require_target(cfg, key)
    node = value_at(cfg, key)
    try:
        return instantiate(node, _partial_=True)
    except Exception as err:
        raise ConfigError(
            f"{key}: could not build {node.get('_target_')} from the config: {err}"
        ) from err


def collector_has_workers(cfg: DictConfig, key: str = "collector") -> bool:
    """Whether the collector at `key` runs worker processes (a replay buffer it fills must
    then live in shared memory)."""
    from hydra.utils import get_class

    from rlcollect.collectors import AsyncBatchedCollector
    from rlcollect.collectors.multiprocess.base import MultiCollectorBase

    require_target(cfg, key)
    try:
        target = get_class(value_at(cfg, key)["_target_"])
    except Exception:  # a bad target is reported, by name, when the collector is built
        return False
    return isinstance(target, type) and issubclass(
        target, (MultiCollectorBase, AsyncBatchedCollector)
    )


def served_by_ray(cfg: DictConfig, key: str) -> bool:
    """Whether the object at `key` is served by Ray (a RayCollector, a RayReplayBuffer): its
    parts run in Ray actors, which reach only what Ray serves."""
    from hydra.utils import get_class

    from rlcollect.collectors import RayCollector

    require_target(cfg, key)
    try:
        target = get_class(value_at(cfg, key)["_target_"])
    except Exception:  # a bad target is reported, by name, when it is built
        return False
    return getattr(target, "service_backend", None) == "ray" or (
        isinstance(target, type) and issubclass(target, RayCollector)
    )


CONFIG_DIR = Path(__file__).resolve().parents[1] / "conf"


def check_overrides(config_name: str, arguments: Sequence[str]) -> None:
    """Before Hydra starts: a command-line override of a key the config lacks (a misspelling)
    ends the script with the closest existing key, where Hydra would only suggest adding the
    misspelt key with `+`. Anything else is left to Hydra, sweeps (`--multirun`) included.

    Raises:
        SystemExit: `config error: <key>: ... Did you mean <key>?`
    """
    if any(argument.startswith("-") for argument in arguments):
        return
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    overrides = list(arguments)
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        try:
            compose(config_name, overrides=overrides)
            return
        except ConfigCompositionException as err:
            found = re.search(r"Could not override '([^']+)'", str(err))
        if found is None:
            return
        key = found.group(1)
        try:
            cfg = compose(config_name, [o for o in overrides if not o.startswith(f"{key}=")])
        except ConfigCompositionException:
            return
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    names = [str(name) for name in node] if isinstance(node, DictConfig) else []
    close = difflib.get_close_matches(leaf, names, n=1)
    prefix = f"{parent}." if parent else ""
    hint = f"Did you mean {prefix}{close[0]}?" if close else f"To add it, write +{key}=..."
    raise SystemExit(f"config error: {key}: the config has no such key. {hint}")


def run_or_exit(train: Callable[[DictConfig], Any], cfg: DictConfig) -> Any:
    """Run a script's `train(cfg)` and return what it returns (a sweep's objective); a config
    error ends the run with its message, no traceback, and removes the run dir Hydra made for
    it when the run wrote nothing there."""
    try:
        return train(cfg)
    except ConfigError as err:
        remove_empty_run_dir()
        raise SystemExit(f"config error: {err}") from err


def remove_empty_run_dir() -> None:
    """Delete this job's run dir if it holds only Hydra's own files (`.hydra/`, the job log):
    a run stopped by a config error should not leave an empty run behind."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    hydra_files = {".hydra", f"{HydraConfig.get().job.name}.log"}
    if run_dir.is_dir() and {path.name for path in run_dir.iterdir()} <= hydra_files:
        shutil.rmtree(run_dir, ignore_errors=True)

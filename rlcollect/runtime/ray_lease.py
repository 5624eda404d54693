"""Ray for rlcollect: imported lazily, started (and shut down) by us only when we started it.

`RayCollector` and `RayReplayBuffer` hold a `RayLease` while they live. The first lease taken
in a process where Ray is not initialised calls `ray.init(**ray_init_config)` (a local cluster,
or with `{"address": "auto"}` the cluster `ray start --head` runs); Ray then belongs to
rlcollect and is shut down when the last lease is released. Ray initialised by anyone else
(the user, a test fixture, a library) is never shut down by a lease.
"""

from __future__ import annotations

import difflib
import inspect
import threading
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from rlcollect.runtime.exits import exit_promptly_on_interrupt

INSTALL_HINT = "pip install 'rlcollect[ray]'"


def require_ray(what: str) -> ModuleType:
    """The `ray` module, or an ImportError saying that `what` needs it and how to install it."""
    try:
        import ray
    except ImportError as err:
        raise ImportError(
            f"{what} needs Ray, which is not installed here; install the ray extra: {INSTALL_HINT}."
        ) from err
    return ray


def plain(value: Any) -> Any:
    """`value` with every mapping turned into a dict and every list-like into a list (Hydra
    passes DictConfig / ListConfig), so that what reaches Ray pickles as plain data."""
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [plain(item) for item in value]
    return value


def check_init_config(ray_init_config: Any) -> dict[str, Any]:
    """`ray_init_config` as a dict of `ray.init` keyword arguments, or an error naming the key.

    Raises:
        TypeError: not a mapping, or a key that `ray.init` does not take (keys that start
            with "_", Ray's hidden options such as `_system_config`, are left to Ray).
    """
    if ray_init_config is None:
        return {}
    if not isinstance(ray_init_config, Mapping):
        raise TypeError(
            "ray_init_config must be a dict of ray.init() keyword arguments (e.g. "
            f'{{"address": "auto"}}) or None; got {ray_init_config!r}.'
        )
    ray = require_ray("ray_init_config")
    accepted = [
        name
        for name, parameter in inspect.signature(ray.init).parameters.items()
        if parameter.kind is not parameter.VAR_KEYWORD
    ]
    for name in ray_init_config:
        # Ray's hidden options (`_system_config`, `_temp_dir`, ...) are read from `**kwargs`;
        # ray.init refuses an unknown one itself.
        if name not in accepted and not str(name).startswith("_"):
            close = difflib.get_close_matches(str(name), accepted, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"ray_init_config has {name!r}, which ray.init() does not take.{hint}")
    return dict(plain(ray_init_config))


class RayLease:
    """A hold on this process's Ray runtime; see the module docstring for who stops Ray."""

    _lock = threading.Lock()
    _holders = 0
    _owned = False

    def __init__(self) -> None:
        self._held = True

    @classmethod
    def acquire(cls, ray_init_config: Mapping[str, Any] | None = None) -> RayLease:
        """Hold Ray, calling `ray.init(**ray_init_config)` first when it is not initialised."""
        ray = require_ray("RayLease")
        config = check_init_config(ray_init_config)
        exit_promptly_on_interrupt()
        with cls._lock:
            if not ray.is_initialized():
                ray.init(**config)
                cls._owned, cls._holders = True, 0
            cls._holders += 1
        return cls()

    def release(self) -> None:
        """Let go of Ray (once; later calls do nothing): the last lease shuts down the Ray that
        a lease started."""
        if not self._held:
            return
        self._held = False
        import ray

        with RayLease._lock:
            RayLease._holders = max(0, RayLease._holders - 1)
            if RayLease._holders == 0 and RayLease._owned:
                RayLease._owned = False
                if ray.is_initialized():
                    ray.shutdown()

"""`make_env`: what a collector accepts as an env, turned into an rlcollect `EnvBase`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlcollect.envs.base import EnvBase
from rlcollect.envs.gym import GymEnv, make_gym_env
from rlcollect.envs.torchrl_env import TorchRLEnv, is_torchrl_env


def make_env(create_env_fn: Any, create_env_kwargs: Mapping[str, Any] | None = None) -> EnvBase:
    """An env from an env instance (ours or TorchRL's), a callable returning one, or a
    Gymnasium id string.

    Raises:
        TypeError: when `create_env_fn` is none of those, or the callable returns something else.
    """
    kwargs = dict(create_env_kwargs or {})
    if isinstance(create_env_fn, str):
        # Made here, not by GymEnv, so that an unknown id names the collector's argument.
        encoding = bool(kwargs.pop("categorical_action_encoding", False))
        gym_env = make_gym_env(create_env_fn, "create_env_fn", **kwargs)
        return GymEnv(gym_env, categorical_action_encoding=encoding)
    is_instance = not isinstance(create_env_fn, type)  # a class is called, as TorchRL does
    if is_instance and (isinstance(create_env_fn, EnvBase) or is_torchrl_env(create_env_fn)):
        if kwargs:
            raise ValueError(
                "create_env_kwargs is only used when create_env_fn is a callable or an id; "
                "got an env instance with create_env_kwargs."
            )
        env = create_env_fn
    elif callable(create_env_fn):
        env = create_env_fn(**kwargs)
    else:
        raise TypeError(
            "create_env_fn must be an env, a callable returning one, or a Gymnasium id; got "
            f"{type(create_env_fn).__name__}."
        )
    if isinstance(env, EnvBase):
        return env
    if is_torchrl_env(env):
        return TorchRLEnv(env)
    raise TypeError(
        f"create_env_fn returned {type(env).__name__}; it must return an rlcollect or TorchRL "
        "env (wrap a Gymnasium env with rlcollect.envs.GymEnv)."
    )

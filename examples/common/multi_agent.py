"""A group of agents in an example: its `EnvInfo` (per agent), probed from the env."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rlcollect import keys

from .config import ConfigError
from .env_info import EnvInfo


def group_info(env: Any, group: str) -> EnvInfo:
    """What one agent of `group` observes and how it acts, for the shared networks.

    Raises:
        ConfigError: naming `env.group` when the env has no such group, and `env` when its
            agents do not act with one discrete action each.
    """
    observation_key = (group, keys.OBSERVATION)
    if observation_key not in env.observation_spec.keys(True, True):
        groups = sorted({key[0] for key in env.observation_keys if isinstance(key, tuple)})
        raise ConfigError(
            f"env.group={group!r}: the env has no observation under {observation_key}; its "
            f"groups are {groups}. Set env.group to one of them."
        )
    group_dims = len(env.batch_size) + 1  # the env's batch dims, then the agent dim
    observation_spec = env.observation_spec[observation_key]
    action_spec = env.action_spec[(group, keys.ACTION)]
    n = getattr(action_spec, "n", None)
    if n is None or action_spec.shape[group_dims:] != torch.Size([]):
        raise ConfigError(
            f"env: the MAPPO networks handle one discrete action per agent; the group's action "
            f"spec is {action_spec!r}. Make the env with continuous_actions=false."
        )
    return EnvInfo(
        observation_key=observation_key,
        observation_shape=tuple(observation_spec.shape[group_dims:]),
        observation_dtype=observation_spec.dtype,
        num_actions=int(torch.as_tensor(n).reshape(-1)[0]),
        action_shape=(),
        action_low=None,
        action_high=None,
        batch_size=tuple(env.batch_size),
    )


def probe_group(env_factory: Callable[[], Any], group: str) -> tuple[EnvInfo, int]:
    """Build one env with `env_factory`, and return `group_info` of `group` and its number
    of agents.

    Raises:
        ConfigError: naming `env.make` when the env cannot be built, or as `group_info`.
    """
    try:
        env = env_factory()
    except Exception as err:
        raise ConfigError(f"env.make: could not build the env from the config: {err}") from err
    try:
        info = group_info(env, group)
        return info, int(env.observation_spec[info.observation_key].shape[len(env.batch_size)])
    finally:
        env.close()

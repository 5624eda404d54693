"""`EnvInfo`: the shapes an example's networks need, read once from a probe env."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rlcollect.envs import Bounded, Categorical, OneHot, Unbounded

from .config import ConfigError


@dataclass(frozen=True)
class EnvInfo:
    """What one sub-env observes and how it acts, without the env's batch dims.

    Attributes:
        observation_key: the env's (single) observation key.
        observation_shape: the shape of one observation, e.g. `(4,)` or `(H, W, C)`.
        observation_dtype: its dtype (`torch.uint8` for pixels).
        num_actions: the number of choices of a discrete action space, else None.
        action_shape: the shape of one continuous action, else `()`.
        action_low, action_high: the bounds of a continuous action (None when unbounded).
        batch_size: the env's batch size (`()` for a single env).

    Examples:
        >>> from rlcollect.envs import GymEnv
        >>> info = EnvInfo.from_env(GymEnv("CartPole-v1", categorical_action_encoding=True))
        >>> info.observation_shape, info.num_actions, info.is_discrete
        ((4,), 2, True)
    """

    observation_key: Any
    observation_shape: tuple[int, ...]
    observation_dtype: torch.dtype
    num_actions: int | None
    action_shape: tuple[int, ...]
    action_low: torch.Tensor | None
    action_high: torch.Tensor | None
    batch_size: tuple[int, ...]

    @property
    def is_discrete(self) -> bool:
        """Whether actions are integer indices."""
        return self.num_actions is not None

    @property
    def num_envs(self) -> int:
        """The number of sub-envs stepped together (1 for a single env)."""
        return max(1, int(torch.Size(self.batch_size).numel()))

    @classmethod
    def from_env(cls, env: Any) -> EnvInfo:
        """Read the observation and action layout of `env` (an rlcollect env).

        Raises:
            ConfigError: naming `env` when the env has several observation keys, one-hot
                actions, or an action space the example networks do not handle.
        """
        batch_dims = len(env.batch_size)
        observation_keys = list(env.observation_keys)
        if len(observation_keys) != 1:
            raise ConfigError(
                f"env: the example networks read one observation key; this env has "
                f"{observation_keys}. Flatten its observation space with a Gymnasium wrapper."
            )
        key = observation_keys[0]
        observation_spec = env.observation_spec[key]
        action_spec = env.action_spec
        common = {
            "observation_key": key[0] if isinstance(key, tuple) and len(key) == 1 else key,
            "observation_shape": tuple(observation_spec.shape[batch_dims:]),
            "observation_dtype": observation_spec.dtype,
            "batch_size": tuple(env.batch_size),
        }
        if isinstance(action_spec, OneHot):
            raise ConfigError(
                "env: the env gives one-hot actions; the examples use integer actions. Set "
                "categorical_action_encoding: true on the GymEnv in the env config."
            )
        if isinstance(action_spec, Categorical):
            bounds = action_spec.n.reshape(-1).unique()
            if bounds.numel() != 1 or action_spec.shape[batch_dims:] != torch.Size([]):
                raise ConfigError(
                    f"env: the examples handle one Discrete action; got {action_spec!r}."
                )
            return cls(**common, num_actions=int(bounds[0]), action_shape=(), **_no_bounds())
        if isinstance(action_spec, (Bounded, Unbounded)) and action_spec.dtype.is_floating_point:
            index = (0,) * batch_dims
            low = action_spec.low[index].clone() if isinstance(action_spec, Bounded) else None
            high = action_spec.high[index].clone() if isinstance(action_spec, Bounded) else None
            shape = tuple(action_spec.shape[batch_dims:])
            return cls(
                **common, num_actions=None, action_shape=shape, action_low=low, action_high=high
            )
        raise ConfigError(
            f"env: the examples handle Discrete and Box action spaces; got {action_spec!r}."
        )

    @classmethod
    def probe(cls, env_factory: Callable[[], Any]) -> EnvInfo:
        """Build one env with `env_factory`, read its layout and close it."""
        env = env_factory()
        try:
            return cls.from_env(env)
        finally:
            env.close()


def _no_bounds() -> dict[str, None]:
    return {"action_low": None, "action_high": None}


def probe_env(env_factory: Callable[[], Any], key: str = "env.make") -> EnvInfo:
    """`EnvInfo.probe(env_factory)`, with a failure to build the env reported against `key`.

    Raises:
        ConfigError: naming `key` when the env cannot be built or is not usable.
    """
    try:
        return EnvInfo.probe(env_factory)
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(f"{key}: could not build the env from the config: {err}") from err

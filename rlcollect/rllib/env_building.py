"""The vector env an RLlib config asks for, built the way RLlib's own runners build it."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.wrappers.vector import DictInfoToList
from ray.rllib.env.env_context import EnvContext
from ray.tune.registry import ENV_CREATOR, _global_registry

# The id under which a registered name or an env class / creator is made with `gym.make_vec`
# (RLlib's runners use the same id, so a user's check of `env.spec.id` reads the same).
LOCAL_ENV_ID = "rllib-single-agent-env-v0"


def env_context(config: Any, worker_index: int | None, num_workers: int) -> EnvContext:
    """`config.env_config` as the `EnvContext` an env creator receives (worker index included)."""
    if isinstance(config.env_config, EnvContext):
        return config.env_config
    return EnvContext(
        config.env_config,
        worker_index=worker_index,
        num_workers=num_workers,
        remote=config.remote_worker_envs,
    )


def _registered_id(config: Any, context: EnvContext) -> tuple[str, dict[str, Any]]:
    """The Gymnasium id to make and the keyword arguments for it.

    A name in Tune's registry and a callable env (a class or a creator) both take the
    `EnvContext`; they are registered with Gymnasium under `LOCAL_ENV_ID` in this process (each
    remote runner registers its own). Anything else is a Gymnasium id made with `env_config`.
    """
    env = config.env
    if isinstance(env, str) and _global_registry.contains(ENV_CREATOR, env):
        creator = _global_registry.get(ENV_CREATOR, env)
    elif callable(env):
        creator = env
    else:
        return env, dict(config.env_config)
    gym.register(
        LOCAL_ENV_ID,
        entry_point=lambda: creator(context),
        vector_entry_point=lambda num_envs: creator(context | {"num_envs": num_envs}),
    )
    return LOCAL_ENV_ID, {}


def build_config_vector_env(
    config: Any, worker_index: int | None, num_workers: int
) -> gym.vector.VectorEnv:
    """The runner's vector env: `num_envs_per_env_runner` copies of `config.env` in the
    config's vectorize mode, infos as one dict per sub-env (as RLlib's episodes keep them).

    Raises:
        ValueError: the config names no env.
    """
    if not config.env:
        raise ValueError(
            f"config.env={config.env!r}: the runner has no env to build; set one with "
            "config.environment('CartPole-v1') (a Gymnasium id, a registered name or an env class)."
        )
    env_id, make_kwargs = _registered_id(config, env_context(config, worker_index, num_workers))
    vector_env = gym.make_vec(
        env_id,
        num_envs=config.num_envs_per_env_runner,
        vectorization_mode=gym.VectorizeMode(config.gym_env_vectorize_mode),
        **make_kwargs,
    )
    return DictInfoToList(vector_env)

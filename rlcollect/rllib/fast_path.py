"""When the engine's loop may sample for RLlib: what it does must equal what RLlib's pipelines
would do."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

from rlcollect.rllib.module_forward import (
    DEFAULT_ENV_TO_MODULE,
    DEFAULT_MODULE_TO_ENV,
    has_only_default_pieces,
)

# Observation spaces whose batched vector-env observation is one NumPy array (what RLlib's
# default env-to-module pieces turn into one tensor).
ARRAY_SPACES = (
    gym.spaces.Box,
    gym.spaces.Discrete,
    gym.spaces.MultiDiscrete,
    gym.spaces.MultiBinary,
)


def fast_path_blocker(runner: Any) -> str | None:
    """Why `runner` must run RLlib's pipelines step by step, or None when the fast path fits."""
    if runner.module is None:
        return "no RLModule (random actions only)"
    if not has_only_default_pieces(runner._env_to_module, DEFAULT_ENV_TO_MODULE):
        return "the env-to-module pipeline has pieces besides RLlib's defaults"
    if not has_only_default_pieces(runner._module_to_env, DEFAULT_MODULE_TO_ENV):
        return "the module-to-env pipeline has pieces besides RLlib's defaults"
    if runner.module.is_stateful():
        return "the RLModule is recurrent (its state travels through the episodes)"
    if runner.has_episode_callbacks():
        return "an episode callback needs live episodes"
    if not isinstance(runner.env.single_observation_space, ARRAY_SPACES):
        return f"observation space {runner.env.single_observation_space!r} is not one array"
    if not runner.env_backend.steps_vector_env:  # an engine env: it takes a reset mask
        return None
    vector_env = getattr(runner.env, "env", None)
    if type(vector_env) not in (SyncVectorEnv, AsyncVectorEnv):
        return f"vector env {type(vector_env).__name__} may not take a reset mask"
    return None

"""Which engine env an RLlib runner samples: Gymnasium's vector env (RLlib's own choice, the
default), EnvPool's thread pools, or sub-envs in worker processes (`ParallelEnv`) with our
transforms. One line picks one:

    config.env_runners(env_runner_cls=SingleAgentEnvRunner.with_backend(EnvPoolBackend()))

In: the runner's config (`config.env`, `env_config`, `num_envs_per_env_runner`, the vectorize
mode). Out: `(env, engine_env)`: what RLlib sees as the runner's `env` (a Gymnasium vector env,
or a face with its spaces) and the engine's `EnvBase` the rollout loop steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from rlcollect.envs.base import EnvBase
from rlcollect.envs.gym import GymEnv
from rlcollect.envs.gym_vector import GymVectorEnv
from rlcollect.envs.parallel import ParallelEnv
from rlcollect.rllib.env_building import build_config_vector_env


class EngineEnvFace:
    """What RLlib reads of a runner's `env` (spaces, `num_envs`, `unwrapped`, `close`), for an
    engine env that is not a Gymnasium vector env. RLlib never steps it: the loop does."""

    def __init__(self, engine_env: EnvBase, observation_space: gym.Space, action_space: gym.Space):
        self.engine_env = engine_env
        self.num_envs = int(engine_env.batch_size[0])
        self.single_observation_space = observation_space
        self.single_action_space = action_space
        self.observation_space = gym.vector.utils.batch_space(observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(action_space, self.num_envs)

    @property
    def unwrapped(self) -> EnvBase:
        """The engine env (what `on_environment_created` and episode callbacks receive)."""
        return self.engine_env

    def close(self) -> None:
        self.engine_env.close()


def _env_id(config: Any, backend: str) -> str:
    if not isinstance(config.env, str):
        raise ValueError(
            f"config.env={config.env!r}: {backend} builds its envs from a Gymnasium id (a str); "
            "use GymVectorBackend() (the default) for an env class or a registered creator."
        )
    return config.env


class GymVectorBackend:
    """Gymnasium's vector env, built from the config as RLlib builds it (the default). Keeps
    every step's infos for RLlib's episodes, and rebuilds the env after a failure with
    `restart_failed_sub_environments`."""

    name = "gymnasium"
    records_steps = True
    steps_vector_env = True  # RLlib's pipelines can step the same env (the general path)

    def build(self, config: Any, worker_index: int | None, num_workers: int) -> tuple[Any, EnvBase]:
        vector_env = build_config_vector_env(config, worker_index, num_workers)
        engine_env = GymVectorEnv(vector_env, categorical_action_encoding=True, record_steps=True)
        return vector_env, engine_env


class EnvPoolBackend:
    """EnvPool's C++ thread pools (`EnvPoolEnv`) over `config.env`, an EnvPool task id.

    Args:
        num_threads: EnvPool's worker threads per pool (None: EnvPool's default).
        batch_size: None (one pool) or the size of each pool in send / recv mode.
        **make_kwargs: passed to `envpool.make` (with `config.env_config`'s entries).
    """

    name = "envpool"
    records_steps = False
    steps_vector_env = False

    def __init__(
        self, *, num_threads: int | None = None, batch_size: int | None = None, **make_kwargs: Any
    ) -> None:
        self.num_threads, self.batch_size, self.make_kwargs = num_threads, batch_size, make_kwargs

    def build(self, config: Any, worker_index: int | None, num_workers: int) -> tuple[Any, EnvBase]:
        from rlcollect.envs.envpool_env import EnvPoolEnv  # the envpool extra

        seed = (config.seed or 0) + 10_000 * (worker_index or 0)
        engine_env = EnvPoolEnv(
            _env_id(config, "EnvPoolBackend"),
            config.num_envs_per_env_runner,
            batch_size=self.batch_size,
            seed=seed,
            num_threads=self.num_threads,
            **(self.make_kwargs | dict(config.env_config)),
        )
        face = EngineEnvFace(
            engine_env, engine_env.single_observation_space, engine_env.single_action_space
        )
        return face, engine_env


class ParallelEnvBackend:
    """`num_envs_per_env_runner` Gymnasium envs of `config.env`, each in a worker process
    (`ParallelEnv`), with an engine transform when given (built per runner by `transform`).

    Args:
        transform: a callable returning the `Transform` to apply (e.g. `lambda:
            RewardSum()`), or None. It must keep the observation's shape: RLlib's module is
            built from the env's observation space.
        mp_start_method: the worker processes' start method (None: rlcollect's default).
    """

    name = "parallel"
    records_steps = False
    steps_vector_env = False

    def __init__(
        self,
        transform: Callable[[], Any] | None = None,
        *,
        mp_start_method: str | None = None,
    ) -> None:
        self.transform, self.mp_start_method = transform, mp_start_method

    def build(self, config: Any, worker_index: int | None, num_workers: int) -> tuple[Any, EnvBase]:
        env_id = _env_id(config, "ParallelEnvBackend")
        env_config = dict(config.env_config)
        probe = gym.make(env_id, **env_config)
        spaces = probe.observation_space, probe.action_space
        probe.close()
        engine_env: EnvBase = ParallelEnv(
            config.num_envs_per_env_runner,
            GymEnv,
            {"env": env_id, "categorical_action_encoding": True, **env_config},
            mp_start_method=self.mp_start_method,
        )
        if self.transform is not None:
            from rlcollect.transforms.transformed_env import TransformedEnv

            engine_env = TransformedEnv(engine_env, self.transform())
        shape = tuple(engine_env.observation_spec["observation"].shape[1:])
        if shape != spaces[0].shape:
            engine_env.close()
            raise ValueError(
                f"ParallelEnvBackend(transform={self.transform!r}) changes the observation "
                f"shape from {spaces[0].shape} to {shape}; RLlib's module is built from the "
                "env's observation space, so use a transform that keeps the shape."
            )
        return EngineEnvFace(engine_env, *spaces), engine_env

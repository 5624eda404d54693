"""`SingleAgentEnvRunner`: RLlib's single-agent EnvRunner contract, sampled by rlcollect's loop."""

from __future__ import annotations

import logging
import math
from typing import Any

import gymnasium as gym
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.env import INPUT_ENV_SINGLE_SPACES, INPUT_ENV_SPACES
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from rlcollect.rllib.engine_sampler import EngineSampler
from rlcollect.rllib.env_backends import GymVectorBackend
from rlcollect.rllib.env_building import env_context
from rlcollect.rllib.fast_path import fast_path_blocker
from rlcollect.rllib.module_forward import RLModuleForward
from rlcollect.rllib.pipeline_sampler import PipelineSampler
from rlcollect.rllib.runner_base import RunnerBase
from rlcollect.rllib.sampled_metrics import EpisodeTally, log_sampled

logger = logging.getLogger(__name__)

EPISODE_HOOKS = ("on_episode_created", "on_episode_start", "on_episode_step", "on_episode_end")


class SingleAgentEnvRunner(RunnerBase):
    """An RLlib EnvRunner whose sampling loop is rlcollect's: give it to an Algorithm with
    `config.env_runners(env_runner_cls=SingleAgentEnvRunner)`.

    RLlib's parts stay RLlib's: the env is built from the config as RLlib builds it, the
    RLModule from the config's spec, the connector pipelines from the config, and `sample()`
    returns RLlib's `SingleAgentEpisode` chunks. When both pipelines are RLlib's defaults, the
    module is not recurrent, no episode callback is set and the observations are one array,
    the fast path runs: the module on the batched observation tensor, every step written into
    preallocated NumPy columns, episodes built once per chunk. Otherwise each step runs
    through RLlib's pipelines on live episodes, with RLlib's semantics.

    Args:
        config: the Algorithm's config (RLlib passes it).

    Keyword Args:
        worker_index: 0 for the Algorithm's local runner, 1, 2, ... for remote ones.
        **kwargs: what RLlib's EnvRunnerGroup passes (num_workers, spaces, tune_trial_id).

    Examples:
        >>> from ray.rllib.algorithms.ppo import PPOConfig
        >>> config = PPOConfig().environment("CartPole-v1").env_runners(
        ...     env_runner_cls=SingleAgentEnvRunner, num_envs_per_env_runner=2
        ... )
        >>> runner = SingleAgentEnvRunner(config=config, worker_index=1)
        >>> runner.uses_fast_path
        True
        >>> episodes = runner.sample(num_timesteps=10)
        >>> 10 <= sum(len(episode) for episode in episodes) < 12
        True
        >>> runner.stop()
    """

    #: Set to False (e.g. on a subclass) to run every config through RLlib's pipelines.
    allow_fast_path = True
    #: The engine env the runner samples (see `with_backend`).
    env_backend: Any = GymVectorBackend()

    @classmethod
    def with_backend(cls, backend: Any) -> type[SingleAgentEnvRunner]:
        """This runner class on another engine env: `GymVectorBackend()` (the default, RLlib's
        own vector env), `EnvPoolBackend()`, or `ParallelEnvBackend(transform=...)`; give the
        result to `config.env_runners(env_runner_cls=...)`."""
        for attribute in ("name", "steps_vector_env", "build"):
            if not hasattr(backend, attribute):
                raise TypeError(
                    f"backend={backend!r} is not an env backend (it has no {attribute!r}); use "
                    "GymVectorBackend(), EnvPoolBackend() or ParallelEnvBackend() from "
                    "rlcollect.rllib."
                )
        name = f"{cls.__name__}[{backend.name}]"
        return type(name, (cls,), {"env_backend": backend, "__module__": cls.__module__})

    def __init__(self, *, config: Any, **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        self._sampler: EngineSampler | PipelineSampler | None = None
        self._tally = EpisodeTally()
        if self._builds_env():
            self.make_env()
        self._env_to_module = self.config.build_env_to_module_connector(
            env=self.env, spaces=self.spaces, device=self._device
        )
        self.make_module()
        self._module_to_env = self.config.build_module_to_env_connector(
            env=self.env, spaces=self.spaces
        )

    # --- building ------------------------------------------------------------------------------

    def make_env(self) -> None:
        """(Re)build the vector env from the config; the next `sample()` resets every sub-env."""
        self._close_env()
        self.env, self.engine_env = self.env_backend.build(
            self.config, self.worker_index, self.num_workers
        )
        self.num_envs = self.env.num_envs
        self._needs_initial_reset = True
        self._announce_env(env_context(self.config, self.worker_index, self.num_workers))

    def make_module(self) -> None:
        """Build the config's RLModule (inference only) on the runner's device."""
        env = self.env.unwrapped if self.env is not None else None
        try:
            spec = self.config.get_rl_module_spec(
                env=env, spaces=self.get_spaces(), inference_only=True
            )
        except NotImplementedError:  # an algorithm without a module: random actions only
            self.module = None
        else:
            self.module = spec.build()
            self.module.to(self._device)
        self._sampler = None

    @property
    def uses_fast_path(self) -> bool:
        """Whether `sample()` runs the fast path (see the class docstring)."""
        return isinstance(self._sampler_for_config(), EngineSampler)

    def _sampler_for_config(self) -> EngineSampler | PipelineSampler:
        if self._sampler is None:
            reason = fast_path_blocker(self) if self.allow_fast_path else "allow_fast_path=False"
            if reason is None:
                forward = RLModuleForward(
                    self.module,
                    self.env.single_action_space,
                    normalize_actions=self.config.normalize_actions,
                    clip_actions=self.config.clip_actions,
                    device=self._device,
                )
                self._sampler = EngineSampler(self, forward)
            elif not self.env_backend.steps_vector_env:
                raise ValueError(
                    f"{type(self).__name__} samples its {self.env_backend.name} env through "
                    f"the engine's loop only, and this config needs RLlib's pipelines: "
                    f"{reason}. Use the default backend (GymVectorBackend()) for it."
                )
            else:
                logger.debug("RLlib's pipelines run step by step: %s", reason)
                self._sampler = PipelineSampler(self)
            self._needs_initial_reset = True
        return self._sampler

    # --- sampling ------------------------------------------------------------------------------

    def _sample(
        self,
        num_timesteps: int | None,
        num_episodes: int | None,
        explore: bool,
        random_actions: bool,
        force_reset: bool,
    ) -> list[SingleAgentEpisode]:
        sampler = self._sampler_for_config()
        if force_reset or num_episodes is not None or self._needs_initial_reset:
            self._reset_sampler(sampler, explore)
        if num_episodes is not None:
            self._needs_initial_reset = True
        kwargs = {
            "explore": explore,
            "random_actions": random_actions,
            "t": self._exploration_timestep,
            "weights_seq_no": self._weights_seq_no,
        }
        if isinstance(sampler, EngineSampler):
            finished, ongoing, steps = self._run_fast(sampler, num_timesteps, num_episodes, kwargs)
        else:
            finished, ongoing, steps = sampler.sample(num_timesteps, num_episodes, **kwargs)
        if isinstance(sampler, PipelineSampler):  # only episode callbacks read earlier chunks
            self._remember_chunks(finished, ongoing)
        for chunk in finished:
            self._tally.add_finished(chunk)
        for chunk in ongoing:
            self._tally.add_ongoing(chunk)
        self._log_env_steps(self._metrics_num_env_steps_sampled, steps)
        log_sampled(self.metrics, steps, len(finished))
        return finished + ongoing

    def _run_fast(
        self,
        sampler: EngineSampler,
        num_timesteps: int | None,
        num_episodes: int | None,
        kwargs: dict[str, Any],
    ) -> tuple[list[SingleAgentEpisode], list[SingleAgentEpisode], int]:
        if num_timesteps is not None:
            steps_per_env = math.ceil(num_timesteps / self.num_envs)
            return sampler.sample_steps(steps_per_env, **kwargs)
        finished, steps = sampler.sample_episodes(num_episodes, **kwargs)
        return finished, [], steps

    def _reset_sampler(self, sampler: EngineSampler | PipelineSampler, explore: bool) -> None:
        seed = self._seed if self._needs_initial_reset else None
        self._tally.forget_ongoing()
        self._earlier_chunks.clear()
        if isinstance(sampler, EngineSampler):
            sampler.reset(seed)
        else:
            sampler.reset(seed, explore)
        self._needs_initial_reset = False

    def single_spaces(self) -> tuple[gym.Space, gym.Space]:
        """One sub-env's observation and action spaces."""
        return self.env.single_observation_space, self.env.single_action_space

    def has_episode_callbacks(self) -> bool:
        """Whether a callback object or function hooks into episodes (created, start, step, end)."""
        for hook in EPISODE_HOOKS:
            if getattr(self.config, f"callbacks_{hook}", None):
                return True
            for callback in self._callbacks:
                if getattr(type(callback), hook) is not getattr(RLlibCallback, hook):
                    return True
        return False

    # --- the rest of RLlib's EnvRunner contract ------------------------------------------------

    def get_spaces(self) -> dict[str, Any]:
        if self.env is None:
            return self.spaces
        return {
            INPUT_ENV_SPACES: (self.env.observation_space, self.env.action_space),
            INPUT_ENV_SINGLE_SPACES: self.single_spaces(),
            DEFAULT_MODULE_ID: (
                self._env_to_module.observation_space,
                self.env.single_action_space,
            ),
        }

    def get_metrics(self) -> dict[str, Any]:
        self._tally.log(
            self.metrics,
            self.config.metrics_num_episodes_for_smoothing,
            self.config.num_env_runners,
        )
        return self.metrics.reduce()

    def _own_module_state(self, module_state: Any) -> Any:
        if isinstance(module_state, dict) and DEFAULT_MODULE_ID in module_state:
            return module_state[DEFAULT_MODULE_ID]
        return module_state

    def assert_healthy(self) -> None:
        """Raises AssertionError unless the env was built (the module may be None: an
        algorithm without one samples random actions)."""
        if not (self.env and hasattr(self, "module")):
            raise AssertionError(f"{type(self).__name__} has no env")

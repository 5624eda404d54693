"""`SingleAgentEnvRunner`: RLlib's single-agent EnvRunner contract, sampled by rlcollect's loop."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Collection
from typing import Any

import gymnasium as gym
import numpy as np
import ray
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.callbacks.utils import make_callback
from ray.rllib.core import (
    COMPONENT_ENV_TO_MODULE_CONNECTOR,
    COMPONENT_MODULE_TO_ENV_CONNECTOR,
    COMPONENT_RL_MODULE,
    DEFAULT_MODULE_ID,
)
from ray.rllib.env import INPUT_ENV_SINGLE_SPACES, INPUT_ENV_SPACES
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils import force_list
from ray.rllib.utils.checkpoints import Checkpointable
from ray.rllib.utils.framework import get_device
from ray.rllib.utils.metrics import (
    ENV_RESET_TIMER,
    ENV_STEP_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    SAMPLE_TIMER,
    TIME_BETWEEN_SAMPLING,
    WEIGHTS_SEQ_NO,
)

from rlcollect.rllib.env_building import env_context, make_vector_env
from rlcollect.rllib.fast_path import fast_path_blocker
from rlcollect.rllib.fast_sampler import EnvRebuiltError, FastSampler
from rlcollect.rllib.module_step import ModuleStep
from rlcollect.rllib.pipeline_sampler import PipelineSampler
from rlcollect.rllib.sampled_metrics import EpisodeTally, log_sampled

logger = logging.getLogger(__name__)

EPISODE_HOOKS = ("on_episode_created", "on_episode_start", "on_episode_step", "on_episode_end")


class SingleAgentEnvRunner(EnvRunner, Checkpointable):
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
    """

    #: Set to False (e.g. on a subclass) to run every config through RLlib's pipelines.
    allow_fast_path = True

    def __init__(self, *, config: Any, **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        self.tune_trial_id = kwargs.get("tune_trial_id")
        self.spaces = kwargs.get("spaces", {})
        self._callbacks = [cls() for cls in force_list(self.config.callbacks_class)]
        gpus = 0 if not self.worker_index else self.config.num_gpus_per_env_runner
        self._device = get_device(self.config, gpus)
        self.env: gym.vector.VectorEnv | None = None
        self.num_envs = 0
        self.episodes_to_numpy = self.config.episodes_to_numpy
        self.lookback = self.config.episode_lookback_horizon
        self._sampler: FastSampler | PipelineSampler | None = None
        if self._builds_env():
            self.make_env()
        self._env_to_module = self.config.build_env_to_module_connector(
            env=self.env, spaces=self.spaces, device=self._device
        )
        self.module: Any = None
        self.make_module()
        self._module_to_env = self.config.build_module_to_env_connector(
            env=self.env, spaces=self.spaces
        )
        self._needs_initial_reset = True
        self._weights_seq_no = 0
        self._tally = EpisodeTally()
        self._time_after_sampling: float | None = None
        self._env_runner_state_server: Any = None
        self._env_step_seconds = 0.0
        self._env_steps_tried = 0

    def _builds_env(self) -> bool:
        """Whether this runner samples: remote runners do; the local one when asked to."""
        return (
            self.worker_index is None
            or self.worker_index > 0
            or self.config.create_env_on_local_worker
            or self.config.num_env_runners == 0
        )

    # --- building ------------------------------------------------------------------------------

    def make_env(self) -> None:
        """(Re)build the vector env from the config; the next `sample()` resets every sub-env."""
        if self.env is not None:
            try:
                self.env.close()
            except Exception as err:  # a broken env may fail to close; the new one replaces it
                logger.warning("closing the old env failed: %r", err)
        self.env = make_vector_env(self.config, self.worker_index, self.num_workers)
        self.num_envs = self.env.num_envs
        self._needs_initial_reset = True
        make_callback(
            "on_environment_created",
            callbacks_objects=self._callbacks,
            callbacks_functions=self.config.callbacks_on_environment_created,
            kwargs={
                "env_runner": self,
                "metrics_logger": self.metrics,
                "env": self.env.unwrapped,
                "env_context": env_context(self.config, self.worker_index, self.num_workers),
            },
        )

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
        return isinstance(self._sampler_for_config(), FastSampler)

    def _sampler_for_config(self) -> FastSampler | PipelineSampler:
        if self._sampler is None:
            reason = fast_path_blocker(self) if self.allow_fast_path else "allow_fast_path=False"
            if reason is None:
                step = ModuleStep(
                    self.module,
                    self.env.single_action_space,
                    normalize_actions=self.config.normalize_actions,
                    clip_actions=self.config.clip_actions,
                    device=self._device,
                )
                self._sampler = FastSampler(self, step)
            else:
                logger.debug("RLlib's pipelines run step by step: %s", reason)
                self._sampler = PipelineSampler(self)
            self._needs_initial_reset = True
        return self._sampler

    # --- sampling ------------------------------------------------------------------------------

    def sample(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool | None = None,
        random_actions: bool = False,
        force_reset: bool = False,
    ) -> list[SingleAgentEpisode]:
        """At least `num_timesteps` env steps (fewer than that plus `num_envs`), or the first
        `num_episodes` episodes to finish, as RLlib episode chunks: the finished episodes, then
        the ongoing ones (which continue, same `id_`, in the next call).

        With neither count, the config decides: `rollout_fragment_length * num_envs` steps with
        `batch_mode="truncate_episodes"`, else `num_envs` whole episodes.

        Raises:
            ValueError: the runner has no env, or both counts were given, or one is negative.
        """
        self._check_sample_arguments(num_timesteps, num_episodes)
        if self._time_after_sampling is not None:
            self.metrics.log_value(
                TIME_BETWEEN_SAMPLING, time.perf_counter() - self._time_after_sampling
            )
        self._pull_state_from_server()
        self.metrics.log_value(WEIGHTS_SEQ_NO, self._weights_seq_no, window=1)
        with self.metrics.log_time(SAMPLE_TIMER):
            explore = self.config.explore if explore is None else explore
            if num_timesteps is None and num_episodes is None:
                if self.config.batch_mode == "truncate_episodes":
                    fragment = self.config.get_rollout_fragment_length(self.worker_index)
                    num_timesteps = fragment * self.num_envs
                else:
                    num_episodes = self.num_envs
            episodes = self._sample(
                num_timesteps, num_episodes, explore, random_actions, force_reset
            )
            make_callback(
                "on_sample_end",
                callbacks_objects=self._callbacks,
                callbacks_functions=self.config.callbacks_on_sample_end,
                kwargs={"env_runner": self, "metrics_logger": self.metrics, "samples": episodes},
            )
        self._time_after_sampling = time.perf_counter()
        return episodes

    def _check_sample_arguments(self, num_timesteps: int | None, num_episodes: int | None) -> None:
        if self.env is None:
            raise ValueError(
                f"{type(self).__name__} (worker_index={self.worker_index}) has no env: the local "
                "runner of an Algorithm with remote runners builds none; sample on a remote "
                "runner, or set config.env_runners(create_env_on_local_worker=True)."
            )
        if num_timesteps is not None and num_episodes is not None:
            raise ValueError(
                f"num_timesteps={num_timesteps} and num_episodes={num_episodes}: give one of them."
            )
        for name, value in (("num_timesteps", num_timesteps), ("num_episodes", num_episodes)):
            if value is not None and value < 0:
                raise ValueError(f"{name}={value} is negative; give a count >= 0.")

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
        self._env_step_seconds, self._env_steps_tried = 0.0, 0
        kwargs = {
            "explore": explore,
            "random_actions": random_actions,
            "t": self._exploration_timestep,
            "weights_seq_no": self._weights_seq_no,
        }
        if isinstance(sampler, FastSampler):
            finished, ongoing, steps = self._run_fast(sampler, num_timesteps, num_episodes, kwargs)
        else:
            finished, ongoing, steps = sampler.sample(num_timesteps, num_episodes, **kwargs)
        for chunk in finished:
            self._tally.add_finished(chunk)
        for chunk in ongoing:
            self._tally.add_ongoing(chunk)
        self._log_step_counts(steps, len(finished))
        return finished + ongoing

    def _run_fast(
        self,
        sampler: FastSampler,
        num_timesteps: int | None,
        num_episodes: int | None,
        kwargs: dict[str, Any],
    ) -> tuple[list[SingleAgentEpisode], list[SingleAgentEpisode], int]:
        if num_timesteps is not None:
            steps_per_env = math.ceil(num_timesteps / self.num_envs)
            return sampler.sample_steps(steps_per_env, **kwargs)
        finished, steps = sampler.sample_episodes(num_episodes, **kwargs)
        return finished, [], steps

    def _reset_sampler(self, sampler: FastSampler | PipelineSampler, explore: bool) -> None:
        seed = self._seed if self._needs_initial_reset else None
        self._tally.forget_ongoing()
        if isinstance(sampler, FastSampler):
            sampler.reset(seed)
        else:
            sampler.reset(seed, explore)
        self._needs_initial_reset = False

    def _exploration_timestep(self, steps_this_sample: int) -> int:
        """The global env step a module's exploration schedule reads (RLlib's estimate: this
        runner's lifetime steps times the number of runners)."""
        runners = self.config.num_env_runners or 1
        return (self.num_env_steps_sampled_lifetime // runners + steps_this_sample) * runners

    def _log_step_counts(self, steps: int, episodes_finished: int) -> None:
        if self._env_steps_tried:
            self.metrics.log_value(ENV_STEP_TIMER, self._env_step_seconds / self._env_steps_tried)
            self._log_env_steps(self._metrics_num_try_env_step, self._env_steps_tried)
        self._log_env_steps(self._metrics_num_env_steps_sampled, steps)
        log_sampled(self.metrics, steps, episodes_finished)

    # --- the env, with RLlib's fault tolerance ------------------------------------------------

    def try_env_reset(
        self, mask: np.ndarray | None, seed: int | None = None
    ) -> tuple[Any, list[dict]]:
        """Reset every sub-env, or those in the bool `mask` (a masked reset that fails with
        `restart_failed_sub_environments` rebuilds the env and raises `EnvRebuiltError`)."""
        options = None if mask is None else {"reset_mask": mask}
        try:
            with self.metrics.log_time(ENV_RESET_TIMER):
                return self.env.reset(seed=seed, options=options)
        except Exception:
            if not self.config.restart_failed_sub_environments:
                raise
            logger.exception("env.reset() failed; rebuilding the env and resetting every sub-env")
            self.make_env()
            if mask is not None:
                self._needs_initial_reset = False  # the caller resets every sub-env at once
                raise EnvRebuiltError from None
            return self.try_env_reset(None, seed=seed)

    def try_env_step(self, actions: Any) -> tuple | None:
        """`env.step(actions)`, timed; None when it failed and the env was rebuilt (the caller
        starts every episode again), an error naming the fix when it failed otherwise."""
        started = time.perf_counter()
        try:
            results = self.env.step(actions)
        except Exception as err:
            self.metrics.log_value("num_env_step_failures", 1, reduce="lifetime_sum")
            if not self.config.restart_failed_sub_environments:
                raise RuntimeError(
                    f"env.step() failed in {type(self).__name__} (worker_index="
                    f"{self.worker_index}): {err!r}. To rebuild the env and go on instead, set "
                    "config.fault_tolerance(restart_failed_sub_environments=True)."
                ) from err
            logger.exception("env.step() failed; rebuilding the env and resetting every sub-env")
            self.make_env()
            self._needs_initial_reset = False  # the caller resets every sub-env at once
            return None
        self._env_step_seconds += time.perf_counter() - started
        self._env_steps_tried += 1
        return results

    def single_spaces(self) -> tuple[gym.Space, gym.Space]:
        """One sub-env's observation and action spaces."""
        return self.env.single_observation_space, self.env.single_action_space

    def episode_callback(self, which: str, index: int, episodes: list[SingleAgentEpisode]) -> None:
        """Make the `which` episode callback for sub-env `index` (the general path's hooks)."""
        kwargs = {
            "episode": episodes[index],
            "env_runner": self,
            "metrics_logger": self.metrics,
            "env": self.env.unwrapped,
            "rl_module": self.module,
            "env_index": index,
        }
        if which == "on_episode_end":
            kwargs["prev_episode_chunks"] = []
        make_callback(
            which,
            callbacks_objects=self._callbacks,
            callbacks_functions=getattr(self.config, f"callbacks_{which}"),
            kwargs=kwargs,
        )

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

    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        state: dict[str, Any] = {
            NUM_ENV_STEPS_SAMPLED_LIFETIME: self.num_env_steps_sampled_lifetime
        }
        if self._check_component(COMPONENT_RL_MODULE, components, not_components):
            state[COMPONENT_RL_MODULE] = self.module.get_state(
                components=self._get_subcomponents(COMPONENT_RL_MODULE, components),
                not_components=self._get_subcomponents(COMPONENT_RL_MODULE, not_components),
                **kwargs,
            )
            state[WEIGHTS_SEQ_NO] = self._weights_seq_no
        pipelines = (
            (COMPONENT_ENV_TO_MODULE_CONNECTOR, self._env_to_module),
            (COMPONENT_MODULE_TO_ENV_CONNECTOR, self._module_to_env),
        )
        for name, pipeline in pipelines:
            if self._check_component(name, components, not_components):
                state[name] = pipeline.get_state()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Connector states, module weights (only when newer than ours, by `WEIGHTS_SEQ_NO`; 0
        or none forces them) and the lifetime step count."""
        if COMPONENT_ENV_TO_MODULE_CONNECTOR in state:
            self._env_to_module.set_state(state[COMPONENT_ENV_TO_MODULE_CONNECTOR])
        if COMPONENT_MODULE_TO_ENV_CONNECTOR in state:
            self._module_to_env.set_state(state[COMPONENT_MODULE_TO_ENV_CONNECTOR])
        if COMPONENT_RL_MODULE in state:
            self._set_module_state(state[COMPONENT_RL_MODULE], state.get(WEIGHTS_SEQ_NO, 0))
        if NUM_ENV_STEPS_SAMPLED_LIFETIME in state:
            self.num_env_steps_sampled_lifetime = state[NUM_ENV_STEPS_SAMPLED_LIFETIME]

    def _set_module_state(self, module_state: Any, seq_no: int) -> None:
        if seq_no == 0 or self._weights_seq_no < seq_no:
            if isinstance(module_state, ray.ObjectRef):
                module_state = ray.get(module_state)
            if isinstance(module_state, dict) and DEFAULT_MODULE_ID in module_state:
                module_state = module_state[DEFAULT_MODULE_ID]
            self.module.set_state(module_state)
        if seq_no > 0:
            self._weights_seq_no = seq_no

    def _pull_state_from_server(self) -> None:
        """With RLlib's `EnvRunnerStateServer`: take its state when newer than ours."""
        if self._env_runner_state_server is None:
            return
        try:
            state = ray.get(
                self._env_runner_state_server.pull_if_newer.remote(self._weights_seq_no)
            )
        except ray.exceptions.RayError as err:
            logger.warning("pulling the state server's state failed (%r); keeping ours", err)
            return
        if state is not None:
            self.set_state(state)

    def get_ctor_args_and_kwargs(self) -> tuple[tuple, dict[str, Any]]:
        return (), {"config": self.config}

    def get_metadata(self) -> dict[str, Any]:
        return Checkpointable.get_metadata(self)

    def get_checkpointable_components(self) -> list[tuple[str, Any]]:
        return [
            (COMPONENT_RL_MODULE, self.module),
            (COMPONENT_ENV_TO_MODULE_CONNECTOR, self._env_to_module),
            (COMPONENT_MODULE_TO_ENV_CONNECTOR, self._module_to_env),
        ]

    def assert_healthy(self) -> None:
        """Raises AssertionError unless the env and the module were built (RLlib's check)."""
        if not (self.env and hasattr(self, "module")):
            raise AssertionError(f"{type(self).__name__} has no env or no module")

    def stop(self) -> None:
        """Close the env (its sub-processes, with `gym_env_vectorize_mode="ASYNC"`)."""
        if self.env is not None:
            self.env.close()

"""What both of our EnvRunners share: RLlib's `sample()` front door, callbacks, state (the
engine's loops and RLlib's fault tolerance around them are `engine_loops.py`'s)."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from typing import Any

import ray
from ray.rllib.callbacks.utils import make_callback
from ray.rllib.core import (
    COMPONENT_ENV_TO_MODULE_CONNECTOR,
    COMPONENT_MODULE_TO_ENV_CONNECTOR,
    COMPONENT_RL_MODULE,
)
from ray.rllib.env.env_runner import EnvRunner
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

logger = logging.getLogger(__name__)


class SampleArgumentError(ValueError, AssertionError):
    """Bad counts given to `sample()`: a ValueError, and an AssertionError too, since RLlib's
    own runners assert on them (code and tests written against RLlib's runners catch that)."""


class RunnerBase(EnvRunner, Checkpointable):
    """RLlib's EnvRunner contract around a subclass's `_sample()`: the counts the config
    implies, explore, the state server, `on_sample_end`, connector and module state (weights
    only when newer, by `WEIGHTS_SEQ_NO`), episode callbacks, checkpoints.

    Subclasses build the env and module (`make_env`, `make_module`) and sample (`_sample`).
    """

    def __init__(self, *, config: Any, **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        self.tune_trial_id = kwargs.get("tune_trial_id")
        self.spaces = kwargs.get("spaces", {})
        self._callbacks = [cls() for cls in force_list(self.config.callbacks_class)]
        gpus = 0 if not self.worker_index else self.config.num_gpus_per_env_runner
        self._device = get_device(self.config, gpus)
        self.env: Any = None
        self.engine_env: Any = None  # the env the engine's loop steps (see env_backends.py)
        self.num_envs = 0
        self.module: Any = None
        self.episodes_to_numpy = self.config.episodes_to_numpy
        self.lookback = self.config.episode_lookback_horizon
        self._needs_initial_reset = True
        self._weights_seq_no = 0
        self._time_after_sampling: float | None = None
        self._env_runner_state_server: Any = None
        self._env_step_seconds = 0.0
        self._env_steps_tried = 0
        self._env_reset_seconds = 0.0
        self._env_resets = 0
        # The chunks already handed out of each ongoing episode (`on_episode_end` gets them as
        # `prev_episode_chunks`, as from RLlib's runners).
        self._earlier_chunks: dict[str, list[Any]] = {}

    def _builds_env(self) -> bool:
        """Whether this runner samples: remote runners do; the local one when asked to."""
        return (
            self.worker_index is None
            or self.worker_index > 0
            or self.config.create_env_on_local_worker
            or self.config.num_env_runners == 0
        )

    def _close_env(self) -> None:
        if self.env is None:
            return
        try:
            self.env.close()
        except Exception as err:  # a broken env may fail to close; the new one replaces it
            logger.warning("closing the old env failed: %r", err)

    def _announce_env(self, context: Any) -> None:
        """Run the config's `on_environment_created` callbacks for the env just (re)built."""
        make_callback(
            "on_environment_created",
            callbacks_objects=self._callbacks,
            callbacks_functions=self.config.callbacks_on_environment_created,
            kwargs={
                "env_runner": self,
                "metrics_logger": self.metrics,
                "env": self.env.unwrapped,
                "env_context": context,
            },
        )

    # --- sampling ------------------------------------------------------------------------------

    def sample(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool | None = None,
        random_actions: bool = False,
        force_reset: bool = False,
    ) -> list[Any]:
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
            since = time.perf_counter() - self._time_after_sampling
            self.metrics.log_value(TIME_BETWEEN_SAMPLING, since)
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
            self._env_step_seconds, self._env_steps_tried = 0.0, 0
            self._env_reset_seconds, self._env_resets = 0.0, 0
            episodes = self._sample(
                num_timesteps, num_episodes, explore, random_actions, force_reset
            )
            self._log_env_step_timing()
            make_callback(
                "on_sample_end",
                callbacks_objects=self._callbacks,
                callbacks_functions=self.config.callbacks_on_sample_end,
                kwargs={"env_runner": self, "metrics_logger": self.metrics, "samples": episodes},
            )
        self._time_after_sampling = time.perf_counter()
        return episodes

    def _sample(
        self,
        num_timesteps: int | None,
        num_episodes: int | None,
        explore: bool,
        random_actions: bool,
        force_reset: bool,
    ) -> list[Any]:
        raise NotImplementedError

    def _check_sample_arguments(self, num_timesteps: int | None, num_episodes: int | None) -> None:
        if self.env is None:
            raise ValueError(
                f"{type(self).__name__} (worker_index={self.worker_index}) has no env: the local "
                "runner of an Algorithm with remote runners builds none; sample on a remote "
                "runner, or set config.env_runners(create_env_on_local_worker=True)."
            )
        if num_timesteps is not None and num_episodes is not None:
            raise SampleArgumentError(
                f"num_timesteps={num_timesteps} and num_episodes={num_episodes}: give one of them."
            )
        for name, value in (("num_timesteps", num_timesteps), ("num_episodes", num_episodes)):
            if value is not None and value < 0:
                raise SampleArgumentError(f"{name}={value} is negative; give a count >= 0.")

    def _exploration_timestep(self, steps_this_sample: int) -> int:
        """The global env step a module's exploration schedule reads (RLlib's estimate: this
        runner's lifetime steps times the number of runners)."""
        runners = self.config.num_env_runners or 1
        return (self.num_env_steps_sampled_lifetime // runners + steps_this_sample) * runners

    def _log_env_step_timing(self) -> None:
        """The mean `env.step()` (and masked `env.reset()`) time of this sample, logged once,
        not per call (a metrics call costs about as much as a small env's step)."""
        if self._env_resets:
            self.metrics.log_value(ENV_RESET_TIMER, self._env_reset_seconds / self._env_resets)
        if self._env_steps_tried:
            self.metrics.log_value(ENV_STEP_TIMER, self._env_step_seconds / self._env_steps_tried)
            self._log_env_steps(self._metrics_num_try_env_step, self._env_steps_tried)

    def _remember_chunks(self, finished: list[Any], ongoing: list[Any]) -> None:
        """Keep the ongoing chunks until their episode finishes."""
        for chunk in finished:
            self._earlier_chunks.pop(chunk.id_, None)
        for chunk in ongoing:
            self._earlier_chunks.setdefault(chunk.id_, []).append(chunk)

    # --- callbacks -------------------------------------------------------------------------------

    def episode_callback(self, which: str, index: int, episodes: list[Any]) -> None:
        """Make the `which` episode callback for sub-env `index` (on live episodes)."""
        kwargs = {
            "episode": episodes[index],
            "env_runner": self,
            "metrics_logger": self.metrics,
            "env": self.env.unwrapped,
            "rl_module": self.module,
            "env_index": index,
        }
        if which == "on_episode_end":
            kwargs["prev_episode_chunks"] = self._earlier_chunks.get(episodes[index].id_, [])
        make_callback(
            which,
            callbacks_objects=self._callbacks,
            callbacks_functions=getattr(self.config, f"callbacks_{which}"),
            kwargs=kwargs,
        )

    # --- state -----------------------------------------------------------------------------------

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
            self.module.set_state(self._own_module_state(module_state))
        if seq_no > 0:
            self._weights_seq_no = seq_no

    def _own_module_state(self, module_state: Any) -> Any:
        """The part of a pushed module state that is this runner's module's."""
        return module_state

    def _pull_state_from_server(self) -> None:
        """With RLlib's `EnvRunnerStateServer`: take its state when newer than ours."""
        if self._env_runner_state_server is None:
            return
        server = self._env_runner_state_server
        try:
            state = ray.get(server.pull_if_newer.remote(self._weights_seq_no))
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
        if not (self.env and self.module is not None):
            raise AssertionError(f"{type(self).__name__} has no env or no module")

    def stop(self) -> None:
        """Close the env (its sub-processes, with an async vectorize mode)."""
        if self.env is not None:
            self.env.close()

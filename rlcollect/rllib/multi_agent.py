"""`MultiAgentEnvRunner`: RLlib's multi-agent EnvRunner contract, sampled by the engine's loop."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import gymnasium as gym
import torch
from ray.rllib.env import INPUT_ENV_SINGLE_SPACES, INPUT_ENV_SPACES
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.env.utils import _gym_env_creator
from ray.rllib.env.vector.registration import make_vec
from ray.rllib.utils.pre_checks.env import check_multiagent_environments
from ray.tune.registry import ENV_CREATOR, _global_registry

from rlcollect.envs.dict_agents import DictAgentsEnv
from rlcollect.rllib.env_building import env_context
from rlcollect.rllib.multi_agent_metrics import MultiAgentEpisodeTally, log_multi_agent_sampled
from rlcollect.rllib.multi_agent_sampler import MultiAgentSampler
from rlcollect.rllib.runner_base import RunnerBase

logger = logging.getLogger(__name__)

# The id under which the config's multi-agent env is made (RLlib's runner uses the same).
LOCAL_MULTI_AGENT_ENV_ID = "rllib-multi-agent-env-v0"


class MultiAgentEnvRunner(RunnerBase):
    """An RLlib EnvRunner for multi-agent configs that samples through the engine's loop: give
    it to an Algorithm with `config.env_runners(env_runner_cls=MultiAgentEnvRunner)`.

    The env (a vector of the config's `MultiAgentEnv`), the `MultiRLModule`, the connector
    pipelines and the `MultiAgentEpisode` chunks are RLlib's. The engine's `RolloutLoop`
    steps the sub-envs (a `DictAgentsEnv` over RLlib's vector env); each step runs through
    RLlib's pipelines on live episodes as the loop's policy step, with RLlib's semantics
    (`count_steps_by` env or agent steps).

    Args:
        config: the Algorithm's (multi-agent) config.

    Keyword Args:
        worker_index: 0 for the Algorithm's local runner, 1, 2, ... for remote ones.
        **kwargs: what RLlib's EnvRunnerGroup passes.

    Raises:
        ValueError: the config is not multi-agent.

    Examples:
        >>> from ray.rllib.algorithms.ppo import PPOConfig
        >>> from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole
        >>> config = (
        ...     PPOConfig()
        ...     .environment(MultiAgentCartPole, env_config={"num_agents": 2})
        ...     .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=lambda a, *_, **__: f"p{a}")
        ...     .env_runners(env_runner_cls=MultiAgentEnvRunner)
        ... )
        >>> runner = MultiAgentEnvRunner(config=config, worker_index=1)
        >>> episodes = runner.sample(num_timesteps=10)
        >>> sum(episode.env_steps() for episode in episodes)
        10
        >>> runner.stop()
    """

    def __init__(self, *, config: Any, **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        if not self.config.is_multi_agent:
            raise ValueError(
                f"{type(self).__name__} needs a multi-agent config (config.multi_agent("
                "policies=..., policy_mapping_fn=...)); for a single-agent config use "
                "rlcollect.rllib.SingleAgentEnvRunner."
            )
        self._tally = MultiAgentEpisodeTally()
        self._sampler: MultiAgentSampler | None = None
        if self._builds_env():
            self.make_env()
        self._env_to_module = self.config.build_env_to_module_connector(
            env=self.env, spaces=self.spaces, device=self._device
        )
        self.make_module()
        self._module_to_env = self.config.build_module_to_env_connector(
            env=self.env.unwrapped if self.env else None, spaces=self.spaces
        )

    def make_env(self) -> None:
        """(Re)build the vector of multi-agent envs from the config."""
        self._close_env()
        context = env_context(self.config, self.worker_index, self.config.num_env_runners)
        if not self.config.env:
            raise ValueError(
                f"config.env={self.config.env!r}: the runner has no env to build; set one with "
                "config.environment(<a MultiAgentEnv class or registered name>)."
            )
        env = self.config.env
        if isinstance(env, str) and _global_registry.contains(ENV_CREATOR, env):
            entry_point = partial(_global_registry.get(ENV_CREATOR, env), context)
        else:
            entry_point = partial(_gym_env_creator, env_descriptor=env, env_context=context)
        gym.register(LOCAL_MULTI_AGENT_ENV_ID, entry_point=entry_point, disable_env_checker=True)
        mode = self.config.gym_env_vectorize_mode
        if not isinstance(mode, gym.envs.registration.VectorizeMode):
            mode = gym.envs.registration.VectorizeMode(mode.lower())
        self.env = make_vec(
            LOCAL_MULTI_AGENT_ENV_ID,
            num_envs=self.config.num_envs_per_env_runner,
            vectorization_mode=mode,
        )
        self.num_envs = self.env.num_envs
        if not self.config.disable_env_checking:
            for sub_env in self.env.envs:
                check_multiagent_environments(sub_env.unwrapped)
        # The engine steps and resets the sub-envs itself (RLlib sees the vector env).
        self.engine_env = DictAgentsEnv(self.env)
        self._needs_initial_reset = True
        self._announce_env(context)

    def make_module(self) -> None:
        """Build the config's MultiRLModule (inference only) on the runner's device."""
        env = self.env.unwrapped if self.env is not None else None
        try:
            spec = self.config.get_multi_rl_module_spec(
                env=env, spaces=self.get_spaces(), inference_only=True
            )
        except NotImplementedError:
            self.module = None
            return
        self.module = spec.build()
        self.module.foreach_module(
            lambda module_id, module: (
                module.to(self._device) if isinstance(module, torch.nn.Module) else module
            )
        )

    def _sample(
        self,
        num_timesteps: int | None,
        num_episodes: int | None,
        explore: bool,
        random_actions: bool,
        force_reset: bool,
    ) -> list[MultiAgentEpisode]:
        if self._sampler is None:
            self._sampler = MultiAgentSampler(self)
        sampler = self._sampler
        if force_reset or num_episodes is not None or self._needs_initial_reset:
            seed = self._seed if self._needs_initial_reset else None
            self._tally.forget_ongoing()
            self._earlier_chunks.clear()
            sampler.reset(seed, explore)
            self._needs_initial_reset = False
        if num_episodes is not None:
            self._needs_initial_reset = True
        finished, ongoing, steps = sampler.sample(
            num_timesteps,
            num_episodes,
            explore=explore,
            random_actions=random_actions,
            t=self._exploration_timestep,
            weights_seq_no=self._weights_seq_no,
        )
        self._remember_chunks(finished, ongoing)
        for chunk in finished:
            self._tally.add_finished(chunk)
        for chunk in ongoing:
            self._tally.add_ongoing(chunk)
        if steps:
            self._log_env_steps(self._metrics_num_env_steps_sampled, steps)
        log_multi_agent_sampled(
            self.metrics, steps, len(finished), sampler.agent_steps, sampler.module_steps
        )
        return finished + ongoing

    def get_spaces(self) -> dict[str, Any]:
        if self.env is None:
            return self.spaces
        return {
            INPUT_ENV_SPACES: (self.env.observation_space, self.env.action_space),
            INPUT_ENV_SINGLE_SPACES: (
                self.env.single_observation_space,
                self.env.single_action_space,
            ),
            **{
                module_id: (space, self._env_to_module.action_space[module_id])
                for module_id, space in self._env_to_module.observation_space.spaces.items()
            },
        }

    def get_metrics(self) -> dict[str, Any]:
        self._tally.log(
            self.metrics,
            self.config.metrics_num_episodes_for_smoothing,
            self.config.num_env_runners,
        )
        return self.metrics.reduce()

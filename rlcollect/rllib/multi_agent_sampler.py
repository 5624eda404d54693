"""The multi-agent loop: RLlib's `MultiAgentEpisode`s, connector pipelines and callbacks,
stepped over a vector of multi-agent envs (the env's own next-step autoreset)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from ray.rllib.core.columns import Columns
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.metrics import ENV_TO_MODULE_CONNECTOR, WEIGHTS_SEQ_NO

from rlcollect.rllib.pipeline_sampler import forward_to_env


def prune_agents_without_steps(episode: MultiAgentEpisode) -> None:
    """Drop the agents that took no step in this chunk (RLlib hands out none of them)."""
    for agent_id, agent_episode in list(episode.agent_episodes.items()):
        if not agent_episode:
            del episode.agent_episodes[agent_id]


class MultiAgentSampler:
    """Samples env steps (or agent steps, by `count_steps_by`) or whole episodes.

    Args:
        runner: the MultiAgentEnvRunner (env, module, pipelines, metrics, callbacks).
    """

    def __init__(self, runner: Any) -> None:
        self._runner = runner
        self.episodes: list[MultiAgentEpisode] = []
        self._shared_data: dict = {}
        self._to_module: Any = None
        self.agent_steps: Counter = Counter()
        self.module_steps: Counter = Counter()

    def _new_episode(self, index: int) -> None:
        runner = self._runner
        env = runner.env.envs[index].unwrapped
        episode = MultiAgentEpisode(
            observation_space={aid: env.get_observation_space(aid) for aid in env.possible_agents},
            action_space={aid: env.get_action_space(aid) for aid in env.possible_agents},
            agent_to_module_mapping_fn=runner.config.policy_mapping_fn,
        )
        if index < len(self.episodes):
            self.episodes[index] = episode
        else:
            self.episodes.append(episode)
        runner.episode_callback("on_episode_created", index, self.episodes)

    def reset(self, seed: int | None, explore: bool) -> None:
        """Reset every sub-env and start fresh episodes (callbacks and env-to-module included)."""
        runner = self._runner
        self._shared_data = {}
        self.episodes = []
        for index in range(runner.num_envs):
            self._new_episode(index)
        observations, infos = runner._try_env_reset(seed=seed, options=None)
        for index, episode in enumerate(self.episodes):
            episode.add_env_reset(observations=observations[index], infos=infos[index])
        self._to_module = None
        if runner.module is not None:
            data = {Columns.OBS: observations, Columns.INFOS: infos}
            self._to_module = self._env_to_module(self.episodes, explore, runner.metrics, data)
        for index in range(runner.num_envs):
            runner.episode_callback("on_episode_start", index, self.episodes)

    def _env_to_module(
        self, episodes: list[MultiAgentEpisode], explore: bool, metrics: Any, data: dict
    ) -> Any:
        runner = self._runner
        return runner._env_to_module(
            rl_module=runner.module,
            episodes=episodes,
            batch={},
            explore=explore,
            shared_data=self._shared_data,
            metrics=metrics,
            metrics_prefix_key=(ENV_TO_MODULE_CONNECTOR,),
            **data,
        )

    def _to_env(self, explore: bool, random_actions: bool, t: int) -> dict[str, Any]:
        """The agents' actions per sub-env: random, or the module and the module-to-env pipeline."""
        runner = self._runner
        if random_actions:
            actions = []
            for index, episode in enumerate(self.episodes):
                env = runner.env.envs[index].unwrapped
                agents = episode.get_agents_to_act()
                actions.append({aid: env.get_action_space(aid).sample() for aid in agents})
            return {Columns.ACTIONS: actions}
        to_module, self._to_module = self._to_module, None
        if not to_module:
            return {}
        return forward_to_env(runner, to_module, self.episodes, self._shared_data, explore, t)

    def sample(
        self,
        num_timesteps: int | None,
        num_episodes: int | None,
        *,
        explore: bool,
        random_actions: bool,
        t: Callable[[int], int],
        weights_seq_no: int,
    ) -> tuple[list[MultiAgentEpisode], list[MultiAgentEpisode], int]:
        """`(finished episodes, ongoing chunks, env steps)`."""
        by_agents = self._runner.config.count_steps_by == "agent_steps"
        self.agent_steps, self.module_steps = Counter(), Counter()
        env_steps, agent_steps, finished = 0, 0, []
        while (
            (len(finished) < num_episodes)
            if num_timesteps is None
            else ((agent_steps if by_agents else env_steps) < num_timesteps)
        ):
            to_env = self._to_env(explore, random_actions, t(env_steps))
            self._shared_data["vector_env_episodes_map"] = {}
            actions = to_env.pop(Columns.ACTIONS, [{} for _ in self.episodes])
            result = self._runner.try_env_step(to_env.pop(Columns.ACTIONS_FOR_ENV, actions))
            if result is None:
                env_steps = agent_steps = 0
                self.reset(None, explore)
                continue
            counted = self._add_step(result, actions, to_env, weights_seq_no)
            env_steps += counted[0]
            agent_steps += counted[1]
            done = self._end_episodes(num_episodes, len(finished))
            self._run_env_to_module(result, actions, done, explore)
            finished.extend(done)
        if self._runner.episodes_to_numpy:
            for episode in finished:
                episode.to_numpy()
        ongoing = self._cut_ongoing() if num_timesteps is not None else []
        return finished, ongoing, env_steps

    def _add_step(
        self, result: tuple, actions: list, to_env: dict, weights_seq_no: int
    ) -> tuple[int, int]:
        observations, rewards, terminateds, truncateds, infos = result
        self._started = set()
        env_steps = agent_steps = 0
        for index, episode in enumerate(self.episodes):
            if not episode.is_reset:
                episode.add_env_reset(observations=observations[index], infos=infos[index])
                self._started.add(index)
                continue
            extras: dict[Any, dict] = {}
            for column, per_env in to_env.items():
                for agent_id, value in per_env[index].items():
                    extras.setdefault(agent_id, {})[column] = value
                    extras[agent_id][WEIGHTS_SEQ_NO] = weights_seq_no
            episode.add_env_step(
                observations=observations[index],
                actions=actions[index],
                rewards=rewards[index],
                infos=infos[index],
                terminateds=terminateds[index],
                truncateds=truncateds[index],
                extra_model_outputs=extras,
            )
            env_steps += 1
            agent_steps += len(observations[index])
            for agent_id in observations[index]:
                self.agent_steps[str(agent_id)] += 1
                self.module_steps[episode.module_for(agent_id)] += 1
        return env_steps, agent_steps

    def _end_episodes(self, num_episodes: int | None, already: int) -> list[MultiAgentEpisode]:
        runner, done = self._runner, []
        for index in range(runner.num_envs):
            which = "on_episode_start" if index in self._started else "on_episode_step"
            runner.episode_callback(which, index, self.episodes)
            episode = self.episodes[index]
            if not episode.is_done:
                continue
            runner.episode_callback("on_episode_end", index, self.episodes)
            prune_agents_without_steps(episode)
            done.append(episode)
            self._new_episode(index)
            self._shared_data["vector_env_episodes_map"][episode.id_] = self.episodes[index].id_
            if num_episodes is not None and already + len(done) >= num_episodes:
                break
        return done

    def _run_env_to_module(
        self, result: tuple, actions: list, done: list[MultiAgentEpisode], explore: bool
    ) -> None:
        """The pipeline on the finished episodes (so connectors finish them), then on the
        ongoing ones (cached for the next forward)."""
        runner = self._runner
        if runner.module is None:
            return
        observations, rewards, terminateds, truncateds, infos = result
        data = {
            Columns.OBS: observations,
            Columns.ACTIONS: actions,
            Columns.REWARDS: rewards,
            Columns.INFOS: infos,
            Columns.TERMINATEDS: terminateds,
            Columns.TRUNCATEDS: truncateds,
        }
        if done:
            self._env_to_module(done, explore, None, data)
        self._to_module = self._env_to_module(self.episodes, explore, runner.metrics, data)

    def _cut_ongoing(self) -> list[MultiAgentEpisode]:
        runner = self._runner
        continuations = [
            episode.cut(len_lookback_buffer=runner.lookback) for episode in self.episodes
        ]
        ongoing = []
        for episode in self.episodes:
            if episode.env_t == 0:
                continue
            episode.validate()
            prune_agents_without_steps(episode)
            ongoing.append(episode.to_numpy() if runner.episodes_to_numpy else episode)
        self.episodes = continuations
        return ongoing

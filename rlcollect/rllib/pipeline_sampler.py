"""The general path: RLlib's connector pipelines and callbacks run on live episodes, step by
step, for configs the fast path does not cover (a user's connectors, recurrent modules,
episode callbacks, structured observations, vector envs without a reset mask)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ray.rllib.core.columns import Columns
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.metrics import ENV_TO_MODULE_CONNECTOR, MODULE_TO_ENV_CONNECTOR, WEIGHTS_SEQ_NO
from ray.rllib.utils.spaces.space_utils import unbatch


class PipelineSampler:
    """RLlib's sampling semantics on live episodes, with the env's own next-step autoreset.

    The env-to-module pipeline runs after every step (its output cached for the next forward),
    the module-to-env pipeline after every forward, and the episode callbacks where RLlib's runner
    makes them (`on_episode_created`, `_start`, `_step`, `_end`).

    Args:
        runner: the EnvRunner (its env, module, pipelines, metrics and callbacks).
    """

    def __init__(self, runner: Any) -> None:
        self._runner = runner
        self.episodes: list[SingleAgentEpisode] = []
        self._shared_data: dict = {}
        self._to_module: Any = None

    def reset(self, seed: int | None, explore: bool) -> None:
        """Reset every sub-env and start fresh episodes (callbacks and env-to-module included)."""
        runner = self._runner
        self._shared_data = {}
        self.episodes = [self._new_episode(index) for index in range(runner.num_envs)]
        observations, infos = runner.try_env_reset(seed=seed)
        observations = unbatch(observations)
        for episode, observation, info in zip(self.episodes, observations, infos, strict=True):
            episode.add_env_reset(observation=observation, infos=info)
        self._to_module = None
        if runner.module is not None:
            self._to_module = self._env_to_module(
                explore, **{Columns.OBS: observations, Columns.INFOS: infos}
            )
        for index in range(runner.num_envs):
            runner.episode_callback("on_episode_start", index, self.episodes)

    def _new_episode(self, index: int) -> SingleAgentEpisode:
        runner = self._runner
        episode = SingleAgentEpisode(
            observation_space=runner.env.single_observation_space,
            action_space=runner.env.single_action_space,
        )
        if len(self.episodes) > index:
            self.episodes[index] = episode
        else:
            self.episodes.append(episode)
        runner.episode_callback("on_episode_created", index, self.episodes)
        return episode

    def _env_to_module(self, explore: bool, **data: Any) -> Any:
        runner = self._runner
        return runner._env_to_module(
            rl_module=runner.module,
            episodes=self.episodes,
            batch={},
            explore=explore,
            shared_data=self._shared_data,
            metrics=runner.metrics,
            metrics_prefix_key=(ENV_TO_MODULE_CONNECTOR,),
            **data,
        )

    def _actions(self, explore: bool, random_actions: bool, t: int) -> dict[str, Any]:
        """What goes to the env: the module's forward and the module-to-env pipeline."""
        runner = self._runner
        if random_actions:
            return {Columns.ACTIONS: runner.env.action_space.sample()}
        to_module, self._to_module = self._to_module, None
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
    ) -> tuple[list[SingleAgentEpisode], list[SingleAgentEpisode], int]:
        """`(finished episodes, ongoing chunks, env steps)`: at least `num_timesteps` steps, or
        the first `num_episodes` episodes to finish (then no ongoing chunk)."""
        steps, finished = 0, []
        while (
            (steps < num_timesteps) if num_timesteps is not None else (len(finished) < num_episodes)
        ):
            to_env = self._actions(explore, random_actions, t(steps))
            actions = to_env.pop(Columns.ACTIONS)
            result = self._runner.try_env_step(to_env.pop(Columns.ACTIONS_FOR_ENV, actions))
            if result is None:
                steps = 0
                self.reset(None, explore)
                continue
            steps += self._add_step(result, actions, to_env, explore, weights_seq_no)
            finished.extend(self._end_episodes(num_episodes, len(finished)))
        ongoing = []
        if num_timesteps is not None:
            ongoing = self._cut_ongoing()
        return finished, ongoing, steps

    def _add_step(
        self, result: tuple, actions: Any, to_env: dict, explore: bool, weights_seq_no: int
    ) -> int:
        """Write one vector step into the episodes; the steps that count (not the autoresets)."""
        observations, rewards, terminateds, truncateds, infos = result
        observations, actions = unbatch(observations), unbatch(actions)
        self._started = set()
        counted = 0
        for index, episode in enumerate(self.episodes):
            if not episode.is_reset:
                episode.add_env_reset(observation=observations[index], infos=infos[index])
                self._started.add(index)
                continue
            extras = {key: value[index] for key, value in to_env.items()}
            extras[WEIGHTS_SEQ_NO] = weights_seq_no
            counted += 1
            episode.add_env_step(
                observation=observations[index],
                action=actions[index],
                reward=rewards[index],
                infos=infos[index],
                terminated=terminateds[index],
                truncated=truncateds[index],
                extra_model_outputs=extras,
            )
        if self._runner.module is not None:
            self._to_module = self._env_to_module(
                explore,
                **{
                    Columns.OBS: observations,
                    Columns.ACTIONS: actions,
                    Columns.REWARDS: rewards,
                    Columns.INFOS: infos,
                    Columns.TERMINATEDS: terminateds,
                    Columns.TRUNCATEDS: truncateds,
                },
            )
        return counted

    def _end_episodes(self, num_episodes: int | None, already: int) -> list[SingleAgentEpisode]:
        runner, finished = self._runner, []
        for index in range(runner.num_envs):
            which = "on_episode_start" if index in self._started else "on_episode_step"
            runner.episode_callback(which, index, self.episodes)
            if not self.episodes[index].is_done:
                continue
            runner.episode_callback("on_episode_end", index, self.episodes)
            episode = self.episodes[index]
            finished.append(episode.to_numpy() if runner.episodes_to_numpy else episode)
            self._new_episode(index)
            if num_episodes is not None and already + len(finished) >= num_episodes:
                break
        return finished

    def _cut_ongoing(self) -> list[SingleAgentEpisode]:
        runner = self._runner
        continuations = [
            episode.cut(len_lookback_buffer=runner.lookback) for episode in self.episodes
        ]
        ongoing = []
        for episode in self.episodes:
            if episode.t == 0:
                continue
            episode.validate()
            ongoing.append(episode.to_numpy() if runner.episodes_to_numpy else episode)
        self.episodes = continuations
        return ongoing


def forward_to_env(
    runner: Any, to_module: Any, episodes: list[Any], shared_data: dict, explore: bool, t: int
) -> dict[str, Any]:
    """The module's forward (exploration or inference) on `to_module`, then the runner's
    module-to-env pipeline: what goes to the env, for single- and multi-agent pipelines."""
    if explore:
        output = runner.module.forward_exploration(to_module, t=t)
    else:
        output = runner.module.forward_inference(to_module)
    return runner._module_to_env(
        rl_module=runner.module,
        batch=output,
        episodes=episodes,
        explore=explore,
        shared_data=shared_data,
        metrics=runner.metrics,
        metrics_prefix_key=(MODULE_TO_ENV_CONNECTOR,),
    )

"""The multi-agent pipelines on the engine: RLlib's `MultiAgentEpisode`s, connector pipelines
and callbacks as the policy step of the engine's `RolloutLoop` over a `DictAgentsEnv` (the
config's vector of `MultiAgentEnv`s). The loop steps the env; the agent dicts come back in the
env's step record; what differs from one agent is here, the rest is `PipelineSampler`'s."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from ray.rllib.core.columns import Columns
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

from rlcollect.rllib.pipeline_sampler import PipelineSampler


def prune_agents_without_steps(episode: MultiAgentEpisode) -> None:
    """Drop the agents that took no step in this chunk (RLlib hands out none of them)."""
    for agent_id, agent_episode in list(episode.agent_episodes.items()):
        if not agent_episode:
            del episode.agent_episodes[agent_id]


class MultiAgentSampler(PipelineSampler):
    """Env steps (or agent steps, by `count_steps_by`) or whole episodes of a vector of
    multi-agent envs, each step through RLlib's pipelines on live `MultiAgentEpisode`s.

    As RLlib's runner: an agent acts when it observed; the episode callbacks run in RLlib's
    order; the env-to-module pipeline sees the episodes that just finished, then the ongoing
    ones. Unlike it, a sub-env that ended is reset by the engine at once (its next episode
    starts on the next step, instead of after an autoreset step of the vector env).

    Args:
        runner: the MultiAgentEnvRunner (env, module, pipelines, metrics, callbacks).
    """

    def __init__(self, runner: Any) -> None:
        self.agent_steps: Counter = Counter()
        self.module_steps: Counter = Counter()
        super().__init__(runner)

    # --- counting ------------------------------------------------------------------------------

    def _restart_count(self) -> None:
        super()._restart_count()
        self._agent_total = 0
        self.agent_steps, self.module_steps = Counter(), Counter()

    def _steps_to_go(self, num_timesteps: int) -> int:
        """Steps per sub-env of the next batch: env steps as one agent's; agent steps so that
        the batch ends at the step that reaches `num_timesteps` or before (a step adds at most
        `max_agents` agent steps per sub-env), as RLlib's runner stops at that step."""
        if self._runner.config.count_steps_by != "agent_steps":
            return super()._steps_to_go(num_timesteps)
        most_per_step = self._runner.num_envs * self.env.max_agents
        return max(0, -(-(num_timesteps - self._agent_total) // most_per_step))

    # --- the step ------------------------------------------------------------------------------

    def _random_to_env(self) -> dict[str, Any]:
        """A random action for each agent to act (from its sub-env's action space)."""
        sub_envs = self._runner.env.envs
        return {
            Columns.ACTIONS: [
                {
                    agent: sub_envs[index].unwrapped.get_action_space(agent).sample()
                    for agent in episode.get_agents_to_act()
                }
                for index, episode in enumerate(self.episodes)
            ]
        }

    def _forward_to_env(self, t: int) -> dict[str, Any]:
        if not self._to_module:  # no agent to act
            self._to_module = None
            return {}
        return super()._forward_to_env(t)

    def _hand_to_env(self, to_env: dict[str, Any]) -> torch.Tensor:
        """The action dicts to the env (staged for its step); per sub-env, the number of
        agents acting as the carrier's action."""
        actions = to_env.pop(Columns.ACTIONS, [{} for _ in self.episodes])
        self._actions = actions
        self.env.set_actions(to_env.pop(Columns.ACTIONS_FOR_ENV, actions))
        self._to_env = to_env
        return torch.tensor([[len(agent_actions)] for agent_actions in actions])

    # --- the episodes beside the carrier -------------------------------------------------------

    def _start_all(self, carrier: Any) -> None:
        """Fresh episodes from the reset at slot 0."""
        runner = self._runner
        self._shared_data = {}
        self.episodes = []
        for index in range(runner.num_envs):
            self._new_episode(index)
        observations = list(self.record.root_observations_at(0))
        infos = list(self.record.root_infos_at(0))
        for episode, observation, info in zip(self.episodes, observations, infos, strict=True):
            episode.add_env_reset(observations=observation, infos=info)
        self._env_to_module(self.episodes, {Columns.OBS: observations, Columns.INFOS: infos})
        for index in range(runner.num_envs):
            runner.episode_callback("on_episode_start", index, self.episodes)

    def _absorb(self, carrier: Any, t: int, restart: bool = True) -> None:
        """The step at slot `t` into the episodes; the episodes that ended there end, and
        (unless `restart` is False: the env failed resetting them) their sub-envs' next
        episodes start from the resets at slot `t + 1`."""
        record = self.record
        step_data = {
            Columns.OBS: record.next_observations[t],
            Columns.ACTIONS: self._actions,
            Columns.REWARDS: record.next_rewards[t],
            Columns.INFOS: record.next_infos[t],
            Columns.TERMINATEDS: record.next_terminateds[t],
            Columns.TRUNCATEDS: record.next_truncateds[t],
        }
        self._shared_data["vector_env_episodes_map"] = {}
        for index, episode in enumerate(self.episodes):
            self._add_step(index, episode, {key: value[index] for key, value in step_data.items()})
        done = self._end_episodes(t + 1 if restart else None)
        if restart:
            if done:  # connectors finish the episodes' last step (e.g. one-hot observations)
                self._env_to_module(done, step_data, timed=False)
            self._env_to_module(self.episodes, step_data)
        if self._runner.episodes_to_numpy:
            for episode in done:
                episode.to_numpy()

    def _add_step(self, index: int, episode: MultiAgentEpisode, data: dict[str, Any]) -> None:
        extras: dict[Any, dict] = {}
        for column, per_env in self._to_env.items():
            for agent_id, value in per_env[index].items():
                extras.setdefault(agent_id, {})[column] = value
                extras[agent_id][WEIGHTS_SEQ_NO] = self._seq_no
        observations = data[Columns.OBS]
        episode.add_env_step(
            observations=observations,
            actions=data[Columns.ACTIONS],
            rewards=data[Columns.REWARDS],
            infos=data[Columns.INFOS],
            terminateds=data[Columns.TERMINATEDS],
            truncateds=data[Columns.TRUNCATEDS],
            extra_model_outputs=extras,
        )
        self.steps += 1
        self._agent_total += len(observations)
        for agent_id in observations:
            self.agent_steps[str(agent_id)] += 1
            self.module_steps[episode.module_for(agent_id)] += 1

    def _end_episodes(self, reset_slot: int | None) -> list[MultiAgentEpisode]:
        """Step callbacks; the episodes that ended end (finished), each sub-env's next one
        starting from its reset at `reset_slot` (None: no next one). Once enough whole
        episodes finished, the later sub-envs are left as they are (RLlib's runner stops
        there too)."""
        runner, done = self._runner, []
        for index in range(runner.num_envs):
            runner.episode_callback("on_episode_step", index, self.episodes)
            episode = self.episodes[index]
            if not episode.is_done:
                continue
            runner.episode_callback("on_episode_end", index, self.episodes)
            prune_agents_without_steps(episode)
            done.append(episode)
            self.finished.append(episode)
            if reset_slot is not None:
                self._new_episode(index)
                fresh = self.episodes[index]
                self._shared_data["vector_env_episodes_map"][episode.id_] = fresh.id_
                fresh.add_env_reset(
                    observations=self.record.root_observations[reset_slot][index],
                    infos=self.record.root_infos[reset_slot][index],
                )
                runner.episode_callback("on_episode_start", index, self.episodes)
            if self._enough():
                break
        return done

    def _new_episode(self, index: int) -> MultiAgentEpisode:
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
        return episode

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

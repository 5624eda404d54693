"""The multi-agent runner's figures under RLlib's names: steps per agent and module, and whole
episodes (length, return, per-agent and per-module returns) over all their chunks."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.metrics import (
    EPISODE_AGENT_RETURN_MEAN,
    EPISODE_AGENT_STEPS,
    EPISODE_DURATION_SEC_MEAN,
    EPISODE_LEN_MAX,
    EPISODE_LEN_MEAN,
    EPISODE_LEN_MIN,
    EPISODE_MODULE_RETURN_MEAN,
    EPISODE_RETURN_MAX,
    EPISODE_RETURN_MEAN,
    EPISODE_RETURN_MIN,
    NUM_AGENT_STEPS_SAMPLED,
    NUM_AGENT_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_SAMPLED,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_EPISODES,
    NUM_EPISODES_LIFETIME,
    NUM_MODULE_STEPS_SAMPLED,
    NUM_MODULE_STEPS_SAMPLED_LIFETIME,
)


def log_multi_agent_sampled(
    metrics: Any, env_steps: int, episodes: int, agent_steps: Counter, module_steps: Counter
) -> None:
    """One sample's counts (env, per agent, per module, episodes), per call and lifetime."""
    metrics.log_value(NUM_ENV_STEPS_SAMPLED, env_steps, reduce="sum")
    metrics.log_value(
        NUM_ENV_STEPS_SAMPLED_LIFETIME, env_steps, reduce="lifetime_sum", with_throughput=True
    )
    metrics.log_value(NUM_EPISODES, episodes, reduce="sum")
    metrics.log_value(NUM_EPISODES_LIFETIME, episodes, reduce="lifetime_sum")
    for agent_id, steps in agent_steps.items():
        metrics.log_value((NUM_AGENT_STEPS_SAMPLED, agent_id), steps, reduce="sum")
        metrics.log_value(
            (NUM_AGENT_STEPS_SAMPLED_LIFETIME, agent_id), steps, reduce="lifetime_sum"
        )
    for module_id, steps in module_steps.items():
        metrics.log_value((NUM_MODULE_STEPS_SAMPLED, module_id), steps, reduce="sum")
        metrics.log_value(
            (NUM_MODULE_STEPS_SAMPLED_LIFETIME, module_id), steps, reduce="lifetime_sum"
        )


@dataclass
class EpisodeSums:
    """One episode's figures summed over its chunks so far."""

    length: int = 0
    total: float = 0.0
    seconds: float = 0.0
    agent_returns: defaultdict = field(default_factory=lambda: defaultdict(float))
    module_returns: defaultdict = field(default_factory=lambda: defaultdict(float))
    agent_steps: defaultdict = field(default_factory=lambda: defaultdict(int))

    def add(self, chunk: MultiAgentEpisode) -> None:
        self.length += len(chunk)
        self.total += chunk.get_return()
        self.seconds += chunk.get_duration_s()
        for agent_episode in chunk.agent_episodes.values():
            agent_return = agent_episode.get_return()
            self.agent_returns[str(agent_episode.agent_id)] += agent_return
            self.module_returns[agent_episode.module_id] += agent_return
            self.agent_steps[str(agent_episode.agent_id)] += len(agent_episode)


class MultiAgentEpisodeTally:
    """Whole-episode figures, logged when an episode's last chunk finishes."""

    def __init__(self) -> None:
        self._earlier: dict[str, EpisodeSums] = {}
        self._finished: list[MultiAgentEpisode] = []

    def add_ongoing(self, chunk: MultiAgentEpisode) -> None:
        self._earlier.setdefault(chunk.id_, EpisodeSums()).add(chunk)

    def add_finished(self, chunk: MultiAgentEpisode) -> None:
        self._finished.append(chunk)

    def forget_ongoing(self) -> None:
        self._earlier.clear()

    def log(self, metrics: Any, num_episodes_for_smoothing: int, num_env_runners: int) -> None:
        window = max(1, math.ceil(num_episodes_for_smoothing / (num_env_runners or 1)))
        for chunk in self._finished:
            sums = self._earlier.pop(chunk.id_, EpisodeSums())
            sums.add(chunk)
            metrics.log_dict(
                {
                    EPISODE_LEN_MEAN: sums.length,
                    EPISODE_RETURN_MEAN: sums.total,
                    EPISODE_DURATION_SEC_MEAN: sums.seconds,
                    EPISODE_AGENT_RETURN_MEAN: dict(sums.agent_returns),
                    EPISODE_AGENT_STEPS: dict(sums.agent_steps),
                    EPISODE_MODULE_RETURN_MEAN: dict(sums.module_returns),
                },
                window=window,
            )
            extremes = {"min": (EPISODE_LEN_MIN, EPISODE_RETURN_MIN)}
            extremes["max"] = (EPISODE_LEN_MAX, EPISODE_RETURN_MAX)
            for reduce, (length_key, return_key) in extremes.items():
                metrics.log_dict(
                    {length_key: sums.length, return_key: sums.total},
                    reduce=reduce,
                    window=window,
                )
        self._finished.clear()

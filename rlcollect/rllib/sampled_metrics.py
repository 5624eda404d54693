"""The per-sample and per-episode figures RLlib's runners log, under RLlib's metric names."""

from __future__ import annotations

import math
from typing import Any

from ray.rllib.core import DEFAULT_AGENT_ID, DEFAULT_MODULE_ID
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.metrics import (
    EPISODE_DURATION_SEC_MEAN,
    EPISODE_LEN_MAX,
    EPISODE_LEN_MEAN,
    EPISODE_LEN_MIN,
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


def log_sampled(metrics: Any, env_steps: int, episodes_finished: int) -> None:
    """One sample's counts: per-call sums and lifetime sums (env steps with throughput)."""
    metrics.log_value(NUM_ENV_STEPS_SAMPLED, env_steps, reduce="sum")
    metrics.log_value((NUM_AGENT_STEPS_SAMPLED, DEFAULT_AGENT_ID), env_steps, reduce="sum")
    metrics.log_value((NUM_MODULE_STEPS_SAMPLED, DEFAULT_MODULE_ID), env_steps, reduce="sum")
    metrics.log_value(NUM_EPISODES, episodes_finished, reduce="sum")
    metrics.log_value(
        NUM_ENV_STEPS_SAMPLED_LIFETIME, env_steps, reduce="lifetime_sum", with_throughput=True
    )
    metrics.log_value(
        (NUM_AGENT_STEPS_SAMPLED_LIFETIME, DEFAULT_AGENT_ID), env_steps, reduce="lifetime_sum"
    )
    metrics.log_value(
        (NUM_MODULE_STEPS_SAMPLED_LIFETIME, DEFAULT_MODULE_ID), env_steps, reduce="lifetime_sum"
    )
    metrics.log_value(NUM_EPISODES_LIFETIME, episodes_finished, reduce="lifetime_sum")


class EpisodeTally:
    """Whole-episode length, return and duration, summed over the chunks of each episode.

    An ongoing chunk handed out by `sample()` is remembered by its `id_` (as three numbers, not
    the chunk); when the episode's last chunk finishes, its figures are logged with the earlier
    chunks' added.
    """

    def __init__(self) -> None:
        self._earlier: dict[str, tuple[int, float, float]] = {}
        self._finished: list[SingleAgentEpisode] = []

    def add_ongoing(self, chunk: SingleAgentEpisode) -> None:
        length, total, seconds = self._earlier.get(chunk.id_, (0, 0.0, 0.0))
        self._earlier[chunk.id_] = (
            length + len(chunk),
            total + chunk.get_return(),
            seconds + chunk.get_duration_s(),
        )

    def add_finished(self, chunk: SingleAgentEpisode) -> None:
        self._finished.append(chunk)

    def forget_ongoing(self) -> None:
        """After a reset of every sub-env: the ongoing episodes will never finish."""
        self._earlier.clear()

    def log(self, metrics: Any, num_episodes_for_smoothing: int, num_env_runners: int) -> None:
        """Log every finished episode since the last call (RLlib's window, shared by runners)."""
        window = max(1, math.ceil(num_episodes_for_smoothing / (num_env_runners or 1)))
        for chunk in self._finished:
            length, total, seconds = self._earlier.pop(chunk.id_, (0, 0.0, 0.0))
            length += len(chunk)
            total += chunk.get_return()
            seconds += chunk.get_duration_s()
            metrics.log_value(EPISODE_LEN_MEAN, length, window=window)
            metrics.log_value(EPISODE_RETURN_MEAN, total, window=window)
            metrics.log_value(EPISODE_DURATION_SEC_MEAN, seconds, window=window)
            metrics.log_value(("agent_episode_return_mean", DEFAULT_AGENT_ID), total, window=window)
            metrics.log_value(
                ("module_episode_return_mean", DEFAULT_MODULE_ID), total, window=window
            )
            metrics.log_value(EPISODE_LEN_MIN, length, reduce="min", window=window)
            metrics.log_value(EPISODE_RETURN_MIN, total, reduce="min", window=window)
            metrics.log_value(EPISODE_LEN_MAX, length, reduce="max", window=window)
            metrics.log_value(EPISODE_RETURN_MAX, total, reduce="max", window=window)
        self._finished.clear()

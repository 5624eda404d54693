"""`EpisodeSampler`: what `CollectorBase.sample()` keeps between calls, RLlib's
`EnvRunner.sample(num_timesteps=..., num_episodes=...)` over a collector's batches.

The collector still collects whole `[*B, T]` batches; an `EpisodeJoiner` (`batch/episodes.py`)
joins each trajectory's pieces across them. Between calls the sampler keeps the episodes that
ended but were not handed out yet, the pieces of the running ones, and how many steps of each
running episode were already handed out (so that the next chunk starts where the last one
stopped, RLlib's `t_started`). Every collected step is handed out exactly once:

* `take_everything()`: every episode that ended, then a chunk of every running episode
  (`is_done == False`; its continuation, with the same `id_`, comes with a later call);
* `take_finished(count)`: the first `count` episodes that ended, in the order the joiner
  returned them (batch by batch, row by row); each is whole, or the rest of one whose first
  chunks were handed out before. What else was collected stays for later calls.

Multi-agent episodes (grouped keys, see `batch/multi_agent_episode.py`) come out as
`AgentEpisodes` objects, one `Episode` per agent, grouped per env episode.
"""

from __future__ import annotations

from collections import deque
from typing import cast

from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.batch.episodes import Episode, EpisodeJoiner
from rlcollect.batch.multi_agent_episode import AgentEpisodes, agent_groups

SampledEpisode = Episode | AgentEpisodes


def check_sample_arguments(num_timesteps: object, num_episodes: object) -> None:
    """Refuse both arguments at once and anything but a positive int, naming the argument.

    Raises:
        ValueError: both are given, or one is below 1.
        TypeError: one is not an int.
    """
    if num_timesteps is not None and num_episodes is not None:
        raise ValueError(
            f"sample() takes num_timesteps or num_episodes, not both; got "
            f"num_timesteps={num_timesteps!r} and num_episodes={num_episodes!r}. Pass one "
            "(or neither, for one batch)."
        )
    for name, value in (("num_timesteps", num_timesteps), ("num_episodes", num_episodes)):
        if value is None:
            continue
        if not keys.is_int(value):
            raise TypeError(
                f"{name} must be a positive int (or None); got {value!r} ({type(value).__name__})."
            )
        if cast(int, value) < 1:
            raise ValueError(f"{name} must be a positive int (or None); got {value!r}.")


class EpisodeSampler:
    """The episodes, and pieces of episodes, collected and not yet handed out by `sample()`."""

    def __init__(self) -> None:
        self.joiner = EpisodeJoiner()
        self._finished: deque[Episode] = deque()
        self._handed_out: dict[int, int] = {}  # running episode id -> steps already handed out

    @property
    def finished_episodes(self) -> int:
        """How many ended episodes wait to be handed out."""
        return len(self._finished)

    @property
    def held_steps(self) -> int:
        """How many collected steps wait to be handed out (ended and running episodes)."""
        return sum(len(episode) for episode in self._finished) + self.joiner.running_steps

    def add(self, batch: TensorDictBase) -> None:
        """Take a collected batch (one the sampler may keep: not overwritten later)."""
        for episode in self.joiner.add(batch):
            episode.t_started = self._handed_out.pop(episode.id_, 0)
            self._finished.append(episode)

    def take_finished(self, count: int) -> list[SampledEpisode]:
        """The first `count` ended episodes (fewer when fewer ended)."""
        taken = [self._finished.popleft() for _ in range(min(count, len(self._finished)))]
        return [as_sampled(episode) for episode in taken]

    def take_everything(self) -> list[SampledEpisode]:
        """Every ended episode, then a chunk of every running one, in that order."""
        taken = list(self._finished)
        self._finished.clear()
        for chunk in self.joiner.take_running():
            chunk.t_started = self._handed_out.get(chunk.id_, 0)
            self._handed_out[chunk.id_] = chunk.t
            taken.append(chunk)
        return [as_sampled(episode) for episode in taken]


def as_sampled(episode: Episode) -> SampledEpisode:
    """`episode` as `sample()` returns it: an `AgentEpisodes` when its transitions hold
    agent groups, itself otherwise."""
    return AgentEpisodes(episode) if agent_groups(episode.transitions) else episode

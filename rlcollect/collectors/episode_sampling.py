"""RLlib's `EnvRunner.sample()` on every collector: batches handed out as episodes.

In: `sample(num_timesteps=..., num_episodes=...)`. Out: `Episode`s (and `AgentEpisodes` for
multi-agent envs), chunks of episodes continuing across calls; built on the collector's
`next()`, so every collector, wherever its loop runs, samples the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlcollect.collectors.sampling.episode_sampler import (
    EpisodeSampler,
    SampledEpisode,
    check_sample_arguments,
)
from rlcollect.errors import MisuseError


class EpisodeSampling:
    """`sample()` on top of the collector's `next()` and `is_done` (`CollectorBase`)."""

    options: Any

    # --- episodes, RLlib's EnvRunner.sample() -----------------------------------------------------

    def sample(
        self, *, num_timesteps: int | None = None, num_episodes: int | None = None
    ) -> list[SampledEpisode]:
        """Collect batches and hand them out as episodes, as RLlib's `EnvRunner.sample()` does.

        The collector collects whole batches (`next()`); what a call does not hand out is
        kept for the next call, so that every collected step is handed out exactly once:

        * `num_timesteps=N`: at least N steps (env steps, summed over sub-envs, workers and
          actors): the steps kept from earlier calls, then whole batches until N are held,
          all handed out: every episode that ended, then a chunk of every running episode
          (`is_done == False`), whose continuation, with the same `id_` and
          `t_started == chunk.t`, comes with a later call. RLlib runs exactly N steps; ours
          are whole batches, and nothing collected is held back;
        * `num_episodes=K`: the first K episodes that end (batch by batch, row by row),
          each whole, or the rest of one whose first chunks an earlier call handed out (its
          `t_started` says where it resumes). RLlib resets the envs and drops what runs past
          the K episodes; here the envs go on, and the steps collected past them wait for
          the next call;
        * neither: one batch (RLlib's rollout fragment), handed out as with `num_timesteps`.

        A multi-agent env's episodes come as `AgentEpisodes` objects: one `Episode` per agent,
        keyed `(group, index)`, grouped per env episode (see `batch/multi_agent_episode.py`);
        steps count env steps.

        When `total_frames` runs out during a call, it returns what it has: the steps held
        (`num_timesteps`, neither) or the episodes that ended (`num_episodes`, fewer than K;
        the running ones stay for a `sample()` without `num_episodes`); with nothing to
        return it raises StopIteration, as `next()` does.

        Args:
            num_timesteps: how many steps to hand out at least.
            num_episodes: how many ended episodes to hand out.

        Returns:
            A list of `Episode`s (single-agent) or `AgentEpisodes` objects.

        Raises:
            ValueError: both arguments, or one below 1.
            TypeError: one is not an int.
            MisuseError: the collector fills a replay buffer (its batches go there).
            StopIteration: `total_frames` ran out and nothing is left to hand out.

        Examples:
            >>> from rlcollect import Collector
            >>> from rlcollect.testing import CountingEnv
            >>> collector = Collector(CountingEnv(episode_length=5), frames_per_batch=4)
            >>> [(e.id_, e.t_started, len(e), e.is_done) for e in collector.sample(num_timesteps=6)]
            [(0, 0, 5, True), (1, 0, 3, False)]
            >>> [(e.id_, e.t_started, len(e)) for e in collector.sample(num_episodes=1)]
            [(1, 3, 2)]
            >>> collector.shutdown()
        """
        check_sample_arguments(num_timesteps, num_episodes)
        if self.options.replay_buffer is not None:
            raise MisuseError(
                "sample() hands batches out as episodes, but this collector writes them to "
                "its replay_buffer; build it without replay_buffer=... to sample episodes."
            )
        sampler = self._episode_sampler()
        if num_episodes is not None:
            self._collect_episodes(sampler, lambda _: sampler.finished_episodes >= num_episodes)
            episodes = sampler.take_finished(num_episodes)
        else:
            steps = num_timesteps
            if steps is None:
                self._collect_episodes(sampler, lambda batches: batches >= 1)
            else:
                self._collect_episodes(sampler, lambda _: sampler.held_steps >= steps)
            episodes = sampler.take_everything()
        if not episodes:
            raise StopIteration
        return episodes

    def _episode_sampler(self) -> EpisodeSampler:
        """This collector's sampling state, made at the first `sample()`."""
        sampler: EpisodeSampler | None = getattr(self, "_sampling_state", None)
        if sampler is None:
            sampler = self._sampling_state = EpisodeSampler()
        return sampler

    def _collect_episodes(self, sampler: EpisodeSampler, enough: Callable[[int], bool]) -> None:
        """Collect batches into `sampler` until `enough(batches collected)` or the end."""
        collected = 0
        while not enough(collected) and not self.is_done:
            try:
                batch = self.next()
            except StopIteration:  # e.g. whole episodes: total_frames ran out mid-episode
                return
            if batch is None:
                raise MisuseError("sample() got no batch from next(); is a replay buffer set?")
            sampler.add(batch.clone() if self.options.return_same_td else batch)
            collected += 1

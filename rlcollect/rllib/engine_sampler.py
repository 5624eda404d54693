"""RLlib's `sample()` on the engine: the RLModule as the policy step of the engine's
`RolloutLoop` over the runner's engine env; each batch read back as RLlib's episode chunks. No env
is stepped here: only the loop steps it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from tensordict.nn import TensorDictModule

from rlcollect import keys
from rlcollect.collectors.rollout import RolloutLoop
from rlcollect.rllib.batch_episodes import BatchReader, Piece, join
from rlcollect.rllib.engine_loops import EPISODE_BATCH_STEPS, EngineLoops
from rlcollect.rllib.episode_chunks import build_chunk
from rlcollect.rllib.module_forward import RLModuleForward, RLModulePolicy


class EngineSampler(EngineLoops):
    """Samples `steps_per_env` steps of every sub-env, or `num_episodes` whole episodes, through
    the engine's rollout loop, with the RLModule called on the batch as RLlib's default
    connector pieces would call it.

    Every step of every sub-env is a transition: the engine resets a sub-env that ended at once
    (with Gymnasium's reset mask; the vector env's own next-step autoreset, which would spend a
    step on it, never runs). One loop per batch length is kept; a new length goes on from where
    the last loop stands, so episodes continue across `sample()` calls of any size.

    Args:
        host: the runner (env, config, failure handling).
        forward: the RLModule's batched forward.
    """

    def __init__(self, host: Any, forward: RLModuleForward) -> None:
        self._forward = forward
        super().__init__(host)

    def _make_policy(self) -> TensorDictModule:
        probe = self.env.observation_spec[keys.OBSERVATION].zero()
        self.policy = RLModulePolicy(self._forward, probe)
        return TensorDictModule(
            self.policy, in_keys=[keys.OBSERVATION], out_keys=self.policy.out_keys
        )

    def _bind_env(self) -> None:
        super()._bind_env()
        # Per sub-env, what its next chunk continues: a cut chunk, or None after a reset.
        self.starts: list[SingleAgentEpisode | None] = [None] * self._host.num_envs

    def reset(self, seed: int | None) -> None:
        """Every sub-env starts a fresh episode at the next batch (seeded when `seed` is given)."""
        self.request_reset(seed)
        self.starts = [None] * self._host.num_envs

    # --- sampling ------------------------------------------------------------------------------

    def sample_steps(
        self,
        steps_per_env: int,
        *,
        explore: bool,
        random_actions: bool,
        t: Callable[[int], int],
        weights_seq_no: int,
    ) -> tuple[list[SingleAgentEpisode], list[SingleAgentEpisode], int]:
        """`(finished chunks, ongoing chunks, env steps)` after `steps_per_env` steps per env;
        each ongoing episode continues in a cut chunk with the same `id_`."""
        finished: list[SingleAgentEpisode] = []
        while True:
            reader = self._collect(steps_per_env, explore, random_actions, t, weights_seq_no)
            if isinstance(reader, BatchReader):
                break
            finished += reader  # the env failed and was rebuilt: the count starts again
        firsts = self._finish(reader, steps_per_env, finished)
        ongoing: list[SingleAgentEpisode] = []
        for index in range(self._host.num_envs):
            if firsts[index] < steps_per_env:
                piece = reader.piece(index, int(firsts[index]), steps_per_env - 1)
                chunk = self._chunk(index, [piece], reader, None)
                ongoing.append(chunk)
                self.starts[index] = chunk.cut(len_lookback_buffer=self._host.lookback)
        return finished, ongoing, steps_per_env * self._host.num_envs

    def sample_episodes(
        self,
        num_episodes: int,
        *,
        explore: bool,
        random_actions: bool,
        t: Callable[[int], int],
        weights_seq_no: int,
    ) -> tuple[list[SingleAgentEpisode], int]:
        """`(the first num_episodes episodes to finish, env steps)`, from fresh resets.

        Batches of `EPISODE_BATCH_STEPS` run until enough episodes finished; an episode that
        spans batches is joined from its pieces. The steps after the row where the last
        episode needed finished are not counted."""
        num_envs = self._host.num_envs
        finished: list[SingleAgentEpisode] = []
        pieces: list[list[Piece]] = [[] for _ in range(num_envs)]
        rows = 0
        while len(finished) < num_episodes:
            steps = EPISODE_BATCH_STEPS
            offset = rows * num_envs
            reader = self._collect(
                steps,
                explore,
                random_actions,
                lambda n, offset=offset: t(n + offset),
                weights_seq_no,
            )
            if not isinstance(reader, BatchReader):  # the env failed and was rebuilt
                finished += reader
                pieces = [[] for _ in range(num_envs)]
                rows = 0
                continue
            last_row = self._finish(reader, steps, finished, pieces, num_episodes)
            if last_row is None:
                rows += steps
                continue
            rows += last_row + 1
        return finished, rows * num_envs

    def _finish(
        self,
        reader: BatchReader,
        completed: int,
        finished: list[SingleAgentEpisode],
        pieces: list[list[Piece]] | None = None,
        limit: int | None = None,
    ) -> Any:
        """Append the chunks of the episodes that ended in the first `completed` rows to
        `finished`, in the order they ended (row by row, sub-env by sub-env).

        Without `pieces`: returns where each sub-env's unfinished run starts. With `pieces`
        (whole episodes, joined across batches): at most `limit` episodes in all; returns the
        row where the last of them ended, or None when more are needed (each sub-env's
        unfinished run then joins its pieces)."""
        firsts = np.zeros(self._host.num_envs, dtype=np.int64)
        for row, index in zip(*np.nonzero(reader.ends(completed).T), strict=True):
            if limit is not None and len(finished) >= limit:
                break
            piece = reader.piece(index, int(firsts[index]), int(row))
            run = [piece] if pieces is None else [*pieces[index], piece]
            finished.append(self._chunk(index, run, reader, int(row)))
            if pieces is not None:
                pieces[index] = []
                if limit is not None and len(finished) >= limit:
                    return int(row)
            firsts[index] = row + 1
        if pieces is None:
            return firsts
        for index in range(self._host.num_envs):
            if firsts[index] < completed:
                pieces[index].append(reader.piece(index, int(firsts[index]), completed - 1))
        return None

    def _collect(
        self,
        steps: int,
        explore: bool,
        random_actions: bool,
        t: Callable[[int], int],
        weights_seq_no: int,
    ) -> BatchReader | list[SingleAgentEpisode]:
        """One batch of `steps` steps through the engine's loop, read back. When the env
        failed and was rebuilt (RLlib's `restart_failed_sub_environments`): the episodes that
        finished before the failure (RLlib keeps them; the ongoing ones are dropped)."""
        self.policy.begin(explore, t)
        loop, err = self._run(steps, random_actions)
        if err is None:
            return self._reader(loop, random_actions, weights_seq_no)
        finished: list[SingleAgentEpisode] = []
        completed = self.completed_steps()
        if loop is not None and completed > 0:
            reader = self._reader(loop, random_actions, weights_seq_no)
            self._finish(reader, completed, finished)
        self.starts = [None] * self._host.num_envs
        self.recover(err)
        return finished

    def _reader(self, loop: RolloutLoop, random_actions: bool, weights_seq_no: int) -> BatchReader:
        return BatchReader(
            loop.layout.carrier,
            self.record,
            self.policy.extra_names,
            {} if random_actions else self.policy.dtypes,
            weights_seq_no,
            random_actions,
        )

    def _chunk(
        self, index: int, pieces: list[Piece], reader: BatchReader, end: int | None
    ) -> SingleAgentEpisode:
        """Sub-env `index`'s chunk of `pieces`, ended at row `end` of the last one (None: cut)."""
        terminated = end is not None and bool(reader.terminated[index, end])
        truncated = end is not None and not terminated and bool(reader.truncated[index, end])
        steps = join(pieces, terminated, truncated)
        start, self.starts[index] = self.starts[index], None
        return build_chunk(start, steps, self._host.single_spaces(), self._host.episodes_to_numpy)

"""The fast path's loop: the vector env stepped with the module's batched actions, each step
written into preallocated columns, RLlib's episodes built once per chunk (not per step)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from ray.rllib.core.columns import Columns
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

from rlcollect.rllib.episode_chunks import ChunkSteps, build_chunk
from rlcollect.rllib.module_step import ModuleStep
from rlcollect.rllib.step_columns import StepColumns

OBSERVATIONS = "observations"
REWARDS = "rewards"
TERMINATED = "terminated"
TRUNCATED = "truncated"
# Columns written by the loop itself, not taken from the module's outputs.
OWN_COLUMNS = (OBSERVATIONS, Columns.ACTIONS, REWARDS, TERMINATED, TRUNCATED)


class EnvRebuiltError(Exception):
    """The env failed and was rebuilt mid-sample: every ongoing episode starts again."""


class SamplerHost(Protocol):
    """What the loop needs from its runner (the env, its spaces, failures, the counters)."""

    env: Any
    num_envs: int
    episodes_to_numpy: bool
    lookback: int

    def try_env_reset(
        self, mask: np.ndarray | None, seed: int | None = None
    ) -> tuple[Any, list[dict]]: ...
    def try_env_step(self, actions: Any) -> tuple | None: ...
    def single_spaces(self) -> tuple[Any, Any]: ...


class FastSampler:
    """Samples `steps_per_env` steps of every sub-env, or `num_episodes` whole episodes.

    Every step of every sub-env is a transition: a sub-env that ended is reset at once with
    Gymnasium's reset mask (the vector env's own next-step autoreset, which would spend a step
    on it, never runs), so the columns are rectangular `[T, num_envs]`.

    Args:
        host: the runner (env, spaces, failure handling).
        module_step: the batched policy step.
    """

    def __init__(self, host: SamplerHost, module_step: ModuleStep | None) -> None:
        self._host = host
        self._module_step = module_step
        self._columns = StepColumns(1)
        self._observations: np.ndarray | None = None
        self._infos: list[dict] = []
        # Per sub-env, what its next chunk continues: a cut chunk, or None after a reset.
        self.starts: list[SingleAgentEpisode | None] = []
        self._seq_row = np.zeros(host.num_envs, dtype=np.int64)
        # When each row's step returned (an episode chunk's duration, for RLlib's metrics).
        self._step_times: list[float] = []

    def reset(self, seed: int | None) -> None:
        """Reset every sub-env (seeded when `seed` is given) and start a fresh episode in each."""
        observations, infos = self._host.try_env_reset(None, seed=seed)
        self._observations = np.array(observations)
        self._infos = list(infos)
        self.starts = [None] * len(self._infos)

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
        finished, steps = self._run(
            steps_per_env,
            None,
            explore=explore,
            random_actions=random_actions,
            t=t,
            weights_seq_no=weights_seq_no,
        )
        ongoing = []
        last = steps - 1 if steps else -1
        for index in range(self._host.num_envs):
            if self._segment_start[index] > last:
                continue
            chunk = self._chunk(index, last, self._observations[index], self._infos[index], False)
            ongoing.append(chunk)
            self.starts[index] = chunk.cut(len_lookback_buffer=self._host.lookback)
        return finished, ongoing, steps * self._host.num_envs

    def sample_episodes(
        self,
        num_episodes: int,
        *,
        explore: bool,
        random_actions: bool,
        t: Callable[[int], int],
        weights_seq_no: int,
    ) -> tuple[list[SingleAgentEpisode], int]:
        """`(the first num_episodes episodes to finish, env steps)`, from fresh resets."""
        finished, steps = self._run(
            None,
            num_episodes,
            explore=explore,
            random_actions=random_actions,
            t=t,
            weights_seq_no=weights_seq_no,
        )
        return finished, steps * self._host.num_envs

    def _run(
        self,
        steps_per_env: int | None,
        num_episodes: int | None,
        *,
        explore: bool,
        random_actions: bool,
        t: Callable[[int], int],
        weights_seq_no: int,
    ) -> tuple[list[SingleAgentEpisode], int]:
        self._seq_row[:] = weights_seq_no
        self._segment_start = np.zeros(self._host.num_envs, dtype=np.int64)
        self._step_times = []
        self._columns.reserve(steps_per_env or 64)
        finished: list[SingleAgentEpisode] = []
        row = 0
        while (
            (row < steps_per_env) if steps_per_env is not None else (len(finished) < num_episodes)
        ):
            self._columns.reserve(row + 1)
            try:
                if self._step(row, explore, random_actions, t(row * self._host.num_envs)):
                    self._finish_episodes(row, num_episodes, finished)
                    row += 1
                    continue
            except EnvRebuiltError:
                pass
            # The env failed and was rebuilt: every ongoing episode starts again.
            self.reset(None)
            self._segment_start[:] = 0
            self._step_times = []
            row = 0
        return finished, row

    def _step(self, row: int, explore: bool, random_actions: bool, t: int) -> bool:
        """One step of every sub-env, written at `row`; False when the env failed."""
        columns = self._columns
        columns.write(OBSERVATIONS, row, self._observations)
        columns.infos[row] = self._infos
        if random_actions or self._module_step is None:
            actions = self._host.env.action_space.sample()
            actions_for_env, extras = actions, {}
        else:
            actions, actions_for_env, extras = self._module_step(
                columns.row(OBSERVATIONS, row), explore=explore, t=t
            )
        result = self._host.try_env_step(actions_for_env)
        if result is None:
            return False
        columns.write(Columns.ACTIONS, row, actions)
        for key, value in extras.items():
            columns.write(key, row, value)
        columns.write(WEIGHTS_SEQ_NO, row, self._seq_row)
        observations, rewards, terminated, truncated, infos = result
        columns.write(REWARDS, row, rewards)
        columns.write(TERMINATED, row, terminated)
        columns.write(TRUNCATED, row, truncated)
        self._step_times.append(time.perf_counter())
        self._observations = observations
        self._infos = infos
        return True

    def _finish_episodes(
        self, row: int, num_episodes: int | None, finished: list[SingleAgentEpisode]
    ) -> None:
        """Append the chunks of the episodes that ended at `row` to `finished`, then reset
        those sub-envs for fresh episodes. The chunks go in before the reset: a reset that
        fails and rebuilds the env (EnvRebuiltError) keeps them, as RLlib keeps an episode
        that finished before a failure."""
        done = self._columns.row(TERMINATED, row) | self._columns.row(TRUNCATED, row)
        if not done.any():
            return
        for index in np.flatnonzero(done):
            if num_episodes is not None and len(finished) >= num_episodes:
                break
            finished.append(
                self._chunk(index, row, self._observations[index], self._infos[index], True)
            )
        reset_observations, reset_infos = self._host.try_env_reset(done)
        observations = np.array(self._observations)
        observations[done] = np.asarray(reset_observations)[done]
        infos = list(self._infos)
        for index in np.flatnonzero(done):
            infos[index] = reset_infos[index]
            self.starts[index] = None
            self._segment_start[index] = row + 1
        self._observations, self._infos = observations, infos

    def _chunk(
        self, index: int, last_row: int, last_observation: Any, last_info: dict, ended: bool
    ) -> SingleAgentEpisode:
        """Sub-env `index`'s chunk from its segment start to `last_row` (inclusive)."""
        columns = self._columns
        first = int(self._segment_start[index])
        rows = slice(first, last_row + 1)
        observations = columns.read(OBSERVATIONS, rows, index)
        extras = {
            name: columns.read(name, rows, index)
            for name in columns.names()
            if name not in OWN_COLUMNS
        }
        steps = ChunkSteps(
            observations=np.concatenate([observations, np.asarray(last_observation)[None]]),
            infos=[columns.infos[row][index] for row in range(first, last_row + 1)] + [last_info],
            actions=columns.read(Columns.ACTIONS, rows, index),
            rewards=columns.read(REWARDS, rows, index),
            extra_model_outputs=extras,
            terminated=ended and bool(columns.row(TERMINATED, last_row)[index]),
            truncated=ended and bool(columns.row(TRUNCATED, last_row)[index]),
            first_step_time=self._step_times[first],
            last_step_time=self._step_times[last_row],
        )
        return build_chunk(
            self.starts[index], steps, self._host.single_spaces(), self._host.episodes_to_numpy
        )

"""The engine's batch, read back as RLlib's episodes: each sub-env's run of steps between two
episode ends becomes the `ChunkSteps` of one `SingleAgentEpisode` chunk."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from ray.rllib.core.columns import Columns
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.envs.step_record import StepRecord
from rlcollect.rllib.episode_chunks import ChunkSteps
from rlcollect.rllib.module_forward import ACTION_KEY, RLLIB_KEY


@dataclass
class Piece:
    """Rows `[first, last]` of one sub-env in one batch, copied out of the carrier (the part
    of an episode a batch holds; an episode spanning batches is several pieces)."""

    observations: np.ndarray  # last - first + 2 rows: the one after the last step included
    infos: list[dict]  # likewise
    actions: np.ndarray
    rewards: np.ndarray
    extras: dict[str, np.ndarray]
    first_step_time: float
    last_step_time: float


def join(pieces: list[Piece], terminated: bool, truncated: bool) -> ChunkSteps:
    """One chunk's steps from its pieces in order (each piece's last observation is the next
    piece's first, so only the last piece keeps it)."""
    if len(pieces) == 1:
        piece = pieces[0]
        observations, infos = piece.observations, piece.infos
        actions, rewards, extras = piece.actions, piece.rewards, piece.extras
    else:
        observations = np.concatenate(
            [p.observations[:-1] for p in pieces] + [pieces[-1].observations[-1:]]
        )
        infos = [info for p in pieces for info in p.infos[:-1]] + pieces[-1].infos[-1:]
        actions = np.concatenate([p.actions for p in pieces])
        rewards = np.concatenate([p.rewards for p in pieces])
        extras = {
            name: np.concatenate([p.extras[name] for p in pieces]) for name in pieces[0].extras
        }
    return ChunkSteps(
        observations=observations,
        infos=infos,
        actions=actions,
        rewards=rewards,
        extra_model_outputs=extras,
        terminated=terminated,
        truncated=truncated,
        first_step_time=pieces[0].first_step_time,
        last_step_time=pieces[-1].last_step_time,
    )


class BatchReader:
    """NumPy views of one carrier's columns, read as pieces of sub-envs' episodes.

    Args:
        carrier: the loop's carrier `[num_envs, T + 1]`, just collected.
        record: the env's step record (infos, step times) for the same slots; None for an env
            that keeps none (its infos are then empty, its step times the batch's end).
        extra_names: the module's extra outputs under `"rllib"` (none with random actions).
        dtypes: RLlib's dtype of each column the module wrote (its actions, its extras).
        weights_seq_no: the weights version of every step of this batch.
    """

    def __init__(
        self,
        carrier: TensorDictBase,
        record: StepRecord | None,
        extra_names: list[str],
        dtypes: dict[str, np.dtype],
        weights_seq_no: int,
        random_actions: bool,
    ) -> None:
        self._record = record
        self._read_at = time.perf_counter()
        self._observations = carrier.get(keys.OBSERVATION).numpy()
        self._next_observations = carrier.get((keys.NEXT, keys.OBSERVATION)).numpy()
        self._rewards = carrier.get((keys.NEXT, keys.REWARD)).numpy()
        self.terminated = carrier.get((keys.NEXT, keys.TERMINATED)).numpy()[..., 0]
        self.truncated = carrier.get((keys.NEXT, keys.TRUNCATED)).numpy()[..., 0]
        if random_actions:  # the env's random action is the action; no module output
            self._actions = carrier.get(ACTION_KEY).numpy()
            self._actions_dtype = self._actions.dtype
            self._extras: dict[str, Any] = {}
        else:
            self._actions = carrier.get((RLLIB_KEY, Columns.ACTIONS)).numpy()
            self._actions_dtype = dtypes[Columns.ACTIONS]
            self._extras = {
                name: (carrier.get((RLLIB_KEY, name)).numpy(), dtypes[name]) for name in extra_names
            }
        self._seq_no = weights_seq_no

    def ends(self, completed: int) -> np.ndarray:
        """`[num_envs, completed]`: where an episode ended, in the first `completed` steps."""
        return self.terminated[:, :completed] | self.truncated[:, :completed]

    def piece(self, index: int, first: int, last: int) -> Piece:
        """Sub-env `index`'s steps `first..last` (inclusive), copied."""
        rows = slice(first, last + 1)
        record = self._record
        observations = np.concatenate(
            [self._observations[index, rows], self._next_observations[index, last : last + 1]]
        )
        if record is None:
            infos: list[dict] = [{} for _ in range(last - first + 2)]
            first_time = last_time = self._read_at
        else:
            infos = [record.root_infos[first][index]]
            infos += [record.next_infos[row][index] for row in range(first, last + 1)]
            first_time, last_time = record.stepped_at[first], record.stepped_at[last]
        extras = {
            name: column[index, rows].astype(dtype, copy=True)
            for name, (column, dtype) in self._extras.items()
        }
        extras[WEIGHTS_SEQ_NO] = np.full(last - first + 1, self._seq_no)
        return Piece(
            observations=observations,
            infos=infos,
            actions=self._actions[index, rows].astype(self._actions_dtype, copy=True),
            rewards=self._rewards[index, rows, 0].astype(np.float64),
            extras=extras,
            first_step_time=float(first_time),
            last_step_time=float(last_time),
        )

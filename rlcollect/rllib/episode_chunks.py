"""RLlib `SingleAgentEpisode` chunks built in one go from the fast path's step columns."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from ray.rllib.env.single_agent_episode import SingleAgentEpisode


def _with_lookback(lookback: Any, steps: np.ndarray) -> np.ndarray:
    """`steps` behind what the previous chunk handed on (a list or array, maybe empty)."""
    if len(lookback) == 0:
        return steps
    return np.concatenate([np.asarray(lookback, dtype=steps.dtype), steps])


@dataclass
class ChunkSteps:
    """One sub-env's steps `[start, stop)` of a sample, read from the step columns.

    `observations` holds `stop - start + 1` rows: the observation before each step and the
    one after the last (the terminal one, when the episode ended there); `infos` likewise.
    """

    observations: np.ndarray
    infos: list[dict]
    actions: np.ndarray
    rewards: np.ndarray
    extra_model_outputs: dict[str, np.ndarray]
    terminated: bool
    truncated: bool
    first_step_time: float
    last_step_time: float


def build_chunk(
    start: SingleAgentEpisode | None,
    steps: ChunkSteps,
    spaces: tuple[gym.Space, gym.Space],
    to_numpy: bool,
) -> SingleAgentEpisode:
    """The chunk that continues `start` (a cut chunk; None: an episode just reset) with
    `steps`: the same `id_` and `t_started`, `start`'s lookback in front, NumPy columns when
    `to_numpy`.

    `start` is left as it was (the chunk is a new object), so a chunk handed to RLlib shares no
    buffer with the runner.
    """
    if start is None:
        return _first_chunk(steps, spaces, to_numpy)
    lookback = len(start.actions.data)  # `start` has no step of its own: all it holds is lookback
    observation_space, action_space = spaces
    extras = {}
    for key, values in steps.extra_model_outputs.items():
        previous = start.extra_model_outputs.get(key)
        extras[key] = _with_lookback(previous.data if previous is not None else [], values)
    chunk = SingleAgentEpisode(
        id_=start.id_,
        observations=_with_lookback(start.observations.data[:-1], steps.observations),
        infos=list(start.infos.data[:-1]) + steps.infos,
        actions=_with_lookback(start.actions.data, steps.actions),
        rewards=_with_lookback(start.rewards.data, steps.rewards),
        extra_model_outputs=extras,
        terminated=steps.terminated,
        truncated=steps.truncated,
        t_started=start.t_started,
        len_lookback_buffer=lookback,
        observation_space=observation_space,
        action_space=action_space,
    )
    chunk._custom_data = start.custom_data
    chunk._start_time = steps.first_step_time
    chunk._last_step_time = steps.last_step_time
    if not to_numpy:
        _as_lists(chunk)
    return chunk


def _first_chunk(
    steps: ChunkSteps, spaces: tuple[gym.Space, gym.Space], to_numpy: bool
) -> SingleAgentEpisode:
    """The first chunk of an episode: a new `id_`, from its reset, no lookback."""
    chunk = SingleAgentEpisode(
        id_=uuid.uuid4().hex,
        observations=steps.observations,
        infos=steps.infos,
        actions=steps.actions,
        rewards=steps.rewards,
        extra_model_outputs=steps.extra_model_outputs,
        terminated=steps.terminated,
        truncated=steps.truncated,
        t_started=0,
        len_lookback_buffer=0,
        observation_space=spaces[0],
        action_space=spaces[1],
    )
    chunk._start_time = steps.first_step_time
    chunk._last_step_time = steps.last_step_time
    if not to_numpy:
        _as_lists(chunk)
    return chunk


def _as_lists(chunk: SingleAgentEpisode) -> None:
    """Lists of items per column, as RLlib's runner leaves them with `episodes_to_numpy=False`."""
    buffers: Sequence[Any] = (
        chunk.observations,
        chunk.actions,
        chunk.rewards,
        *chunk.extra_model_outputs.values(),
    )
    for buffer in buffers:
        buffer.data = list(buffer.data)
        buffer.finalized = False

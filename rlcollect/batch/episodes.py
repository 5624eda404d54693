"""Whole episodes from batches: `EpisodeJoiner` joins the pieces of each trajectory across
batches, and `Episode` reads one as RLlib's `SingleAgentEpisode` does.

A collector cuts episodes at batch boundaries (`batch_mode="truncate_episodes"`). The joiner
keeps the running piece of every trajectory, by `("collector", "traj_ids")`, so it works for any
collector's batches (the ids are unique across workers and actors, and asynchronous collectors
interleave workers), and hands back each episode once it ends: done, or cut by a truncation
without a reset (a soft horizon). An episode's transitions are a `[T]` TensorDict; its T + 1
observations are the T root ones and the last `"next"` one.

`take_running()` hands out the running pieces too, as chunks of episodes that go on (RLlib's
episode chunks, `is_done == False`): their continuation is joined from the next pieces on.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, cast

import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.batch.compact import is_compact, transition_view
from rlcollect.batch.flags import end_of_trajectory

NestedKey = str | tuple[str, ...]


def _next(key: NestedKey) -> tuple[str, ...]:
    return (keys.NEXT, key) if isinstance(key, str) else (keys.NEXT, *key)


class Episode:
    """One whole episode (or the piece of one a soft horizon cut), or a chunk of one, over its
    `[T]` transitions.

    A chunk (RLlib's episode chunk) holds the steps `t_started .. t - 1` of its episode; the
    chunks of one episode share its `id_`, each continuation starting at the step where the
    chunk before it stopped (its first observation is that chunk's last), and only the last
    chunk `is_done`.

    Args:
        transitions: the episode's steps in order, with `"next"` entries (time is dim 0).
        t_started: the step of the episode at which these transitions start (0: from its
            reset).
    """

    def __init__(self, transitions: TensorDictBase, t_started: int = 0) -> None:
        self.transitions = transitions
        self.t_started = t_started

    @property
    def id_(self) -> int:
        """The trajectory id the collector gave it."""
        return int(self.transitions.get(keys.TRAJ_IDS)[0])

    def __len__(self) -> int:
        return int(self.transitions.shape[0])

    @property
    def t(self) -> int:
        """The step of the episode after the last one held: `t_started + len(episode)`."""
        return self.t_started + len(self)

    def get_observations(self, key: NestedKey = keys.OBSERVATION) -> torch.Tensor:
        """`[T + 1, ...]`: every observation, the final one (after the last step) included."""
        final = self.transitions.get(_next(key))[-1:]
        return torch.cat([self.transitions.get(key), final])

    def get_actions(self, key: NestedKey = keys.ACTION) -> torch.Tensor:
        """`[T, ...]`: the action of every step."""
        return cast(torch.Tensor, self.transitions.get(key))

    def get_rewards(self, key: NestedKey = keys.REWARD) -> torch.Tensor:
        """`[T, ...]`: the reward of every step."""
        return cast(torch.Tensor, self.transitions.get(_next(key)))

    def get_return(self, key: NestedKey = keys.REWARD) -> float:
        """The undiscounted sum of the rewards (summed over agents for a group's reward)."""
        return float(self.get_rewards(key).sum())

    def _last(self, flag: str) -> bool:
        value = self.transitions.get((keys.NEXT, flag), None)
        return value is not None and bool(value[-1].any())

    @property
    def is_terminated(self) -> bool:
        """Whether the episode ended in a terminal state (no bootstrapping)."""
        return self._last(keys.TERMINATED)

    @property
    def is_truncated(self) -> bool:
        """Whether it was cut (time limit, `set_truncated`, soft horizon): bootstrap."""
        return self._last(keys.TRUNCATED)

    @property
    def is_done(self) -> bool:
        """Whether the episode ended here; False for a chunk of one that goes on."""
        return self.is_terminated or self.is_truncated

    def __repr__(self) -> str:
        return (
            f"Episode(id_={self.id_}, t_started={self.t_started}, len={len(self)}, "
            f"return={self.get_return():.4g}, terminated={self.is_terminated}, "
            f"truncated={self.is_truncated})"
        )


class EpisodeJoiner:
    """Joins the pieces of trajectories across batches and returns the episodes that ended.

    Args:
        end_keys: the flags under `"next"` that end a trajectory (any set ends it); default
            `"done"` and `"truncated"` (a soft horizon's cut sets truncated without done).

    Examples:
        >>> from rlcollect import Collector, EpisodeJoiner
        >>> collector = Collector("CartPole-v1", frames_per_batch=64, total_frames=640)
        >>> collector.set_seed(0)
        1
        >>> joiner = EpisodeJoiner()
        >>> episodes = [episode for batch in collector for episode in joiner.add(batch)]
        >>> collector.shutdown()
        >>> all(episode.is_done for episode in episodes)
        True
        >>> first = episodes[0]
        >>> first.get_observations().shape[0] == len(first) + 1
        True
    """

    def __init__(self, end_keys: Sequence[NestedKey] = (keys.DONE, keys.TRUNCATED)) -> None:
        if isinstance(end_keys, str) or not end_keys:
            raise TypeError(f"end_keys must be a non-empty list of flag keys; got {end_keys!r}.")
        self.end_keys = [_next(key) for key in end_keys]
        self._running: dict[int, list[TensorDictBase]] = {}

    @property
    def running(self) -> int:
        """How many trajectories have a piece kept, waiting for their end."""
        return len(self._running)

    @property
    def running_steps(self) -> int:
        """How many steps the pieces kept hold, all trajectories together."""
        return sum(len(piece) for pieces in self._running.values() for piece in pieces)

    def drop_running(self) -> None:
        """Forget the pieces kept (e.g. after `collector.reset()`: they will not go on)."""
        self._running.clear()

    def take_running(self) -> list[Episode]:
        """The pieces kept, joined per trajectory into chunks of episodes that go on (not
        done), and forgotten: the next pieces of those trajectories start new chunks."""
        chunks = [Episode(joined_pieces(pieces)) for pieces in self._running.values()]
        self._running.clear()
        return chunks

    def add(self, batch: TensorDictBase) -> list[Episode]:
        """Take a batch (`[*B, T]`, time last; a split `[num_trajs, max_len]` one with its
        mask, or a compact one) and return the episodes that ended in it, in the order of
        their ends within each row."""
        rows = self._rows(batch)
        ids = rows.get(keys.TRAJ_IDS)
        present = [key for key in self.end_keys if key in rows.keys(include_nested=True)]
        if not present:
            raise KeyError(f"the batch has none of the end flags {self.end_keys}.")
        ended = end_of_trajectory([rows.get(key) for key in present], 2)
        finished: list[Episode] = []
        for row in range(rows.shape[0]):
            finished.extend(self._add_row(rows[row], ids[row], ended[row]))
        return finished

    def _rows(self, batch: TensorDictBase) -> TensorDictBase:
        if is_compact(batch):
            batch = transition_view(batch)
        if keys.TRAJ_IDS not in batch.keys(include_nested=True):
            raise KeyError(
                "EpisodeJoiner tells trajectories apart by ('collector', 'traj_ids'); collect "
                "with track_traj_ids=True (the default)."
            )
        if batch.ndim == 0:
            raise ValueError("EpisodeJoiner takes batches with a time dim; got batch_size=[].")
        return batch.reshape(-1, batch.shape[-1])

    def _add_row(
        self, row: TensorDictBase, ids: torch.Tensor, ended: torch.Tensor
    ) -> list[Episode]:
        mask = row.get(keys.MASK, None)
        if mask is not None:
            row, ids, ended = row[mask], ids[mask], ended[mask]
        # A run of steps with one id is one trajectory's piece; it ends at its first end flag.
        cuts = (ids[1:] != ids[:-1]) | ended[:-1]
        bounds = [0, *(torch.nonzero(cuts).flatten() + 1).tolist(), len(ids)]
        finished = []
        for start, stop in itertools.pairwise(bounds):
            if start == stop:
                continue
            trajectory = int(ids[start])
            pieces = self._running.pop(trajectory, [])
            pieces.append(row[start:stop])
            if bool(ended[stop - 1]):
                finished.append(Episode(joined_pieces(pieces)))
            else:
                self._running[trajectory] = pieces
        return finished


def joined_pieces(pieces: list[TensorDictBase]) -> TensorDictBase:
    """One trajectory's transitions: its pieces concatenated along time (a view of the batch
    when it ended in the batch it began in), time named."""
    episode = pieces[0] if len(pieces) == 1 else torch.cat(cast(Any, pieces), 0)
    episode = cast(TensorDictBase, episode)
    episode.names = [keys.TIME_DIM_NAME]
    return episode

"""An env maker holding a tensor in shared memory (a "board"), for the worker tests.

Each env made writes, at every reset and step, how many it has done into its own slot of the
board, and observes the whole board as it reads it (`"board"`). Handed to workers shared, a
worker's writes are seen by the parent and in the other workers' observations; handed over
copied, each worker writes and reads a board of its own.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule

from rlcollect.envs.specs import Composite, Unbounded
from rlcollect.testing import CountingEnv
from rlcollect.transforms import Transform, TransformedEnv

BOARD = "board"
PARENT_SLOT = -1  # the last slot is the parent's to write


class BoardTransform(Transform):
    """Counts this env's resets and steps in `board[slot]`; observes the whole board."""

    def __init__(self, board: torch.Tensor, slot: int) -> None:
        super().__init__(in_keys=[], out_keys=[BOARD])
        self.board = board
        self.slot = slot

    def _tally(self, tensordict: TensorDictBase) -> TensorDictBase:
        self.board[self.slot] += 1  # only this env writes its slot: no race
        tensordict.set(BOARD, self.board.clone())
        return tensordict

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        return self._tally(tensordict_reset)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        return self._tally(next_tensordict)

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        observation_spec[BOARD] = Unbounded(shape=self.board.shape, dtype=self.board.dtype)
        return observation_spec


def board_env(board: torch.Tensor, slot: int) -> TransformedEnv:
    """A counting env (episodes of 4 steps) that tallies in `board[slot]`."""
    return TransformedEnv(CountingEnv(episode_length=4), BoardTransform(board, slot))


def shared_board(workers: int) -> torch.Tensor:
    """A board in shared memory: one slot per worker, and the parent's last."""
    return torch.zeros(workers + 1).share_memory_()


def board_makers(board: torch.Tensor) -> list[Any]:
    """One maker per worker slot, each a `functools.partial` holding the same board."""
    return [functools.partial(board_env, board, slot) for slot in range(board.numel() - 1)]


class FirstAction(torch.nn.Module):
    """Always action 0; holds a parameter (`scale`) for weight tests."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.zeros(observation.shape[:-1], dtype=torch.int64)


def first_action_policy() -> TensorDictModule:
    """`FirstAction` reading `"observation"`, writing `"action"`."""
    return TensorDictModule(FirstAction(), in_keys=["observation"], out_keys=["action"])

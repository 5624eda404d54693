"""An env maker holding a tensor in shared memory (a "board"), for the worker tests.

Each env made writes, at every reset and step, how many it has done into its own slot of the
board, and observes the whole board as it reads it (`"board"`). Handed to workers shared, a
worker's writes are seen by the parent and in the other workers' observations; handed over
copied, each worker writes and reads a board of its own.

And TorchRL's way to share running statistics: a maker over `VecNormV2(shared_data=...)`, the
statistics in shared memory (with a shared lock), which every env made updates; run with our
collectors here and with TorchRL's in `frontends_side.py`.
"""

from __future__ import annotations

import functools
import multiprocessing
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
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


def vecnorm_cartpole(stats: TensorDictBase, lock: Any) -> Any:
    """TorchRL's CartPole, episodes of 5 steps, its observation normalised by a `VecNormV2`
    whose statistics are `stats`."""
    from torchrl.envs import Compose, GymEnv, StepCounter, TransformedEnv, VecNormV2

    return TransformedEnv(
        GymEnv("CartPole-v1"),
        Compose(
            StepCounter(max_steps=5),
            VecNormV2(in_keys=["observation"], shared_data=stats, lock=lock),
        ),
    )


def count_in_shared_statistics(
    collector_class: Any, frames_per_batch: int, batches: int
) -> dict[str, float]:
    """Collect with `collector_class` over two makers sharing one set of statistics: the frames
    collected, and how many observations the statistics counted, as this process sees them."""
    observations = {"observation": torch.zeros(4)}
    stats = TensorDict(
        loc=observations, var=observations, count={"observation": torch.zeros(())}
    ).share_memory_()
    lock = multiprocessing.get_context("spawn").Lock()
    maker = functools.partial(vecnorm_cartpole, stats, lock)
    collector = collector_class(
        [maker, maker],
        None,
        frames_per_batch=frames_per_batch,
        total_frames=frames_per_batch * batches,
        cat_results="stack",
    )
    try:
        frames = sum(batch.numel() for batch in collector)
    finally:
        collector.shutdown()
    return {"frames": frames, "count": float(stats["count", "observation"])}

"""What the CUDA tests share: the device parameters, a counter of synchronizing CUDA calls, and
policies whose outputs are exact on any device.

Everything here runs on a CPU-only machine too: each CUDA test has a CPU twin (the same body
with `device="cpu"`) that proves the test's own logic where no GPU is at hand. Imports stay
within torch, tensordict, gymnasium, numpy, pytest and rlcollect (the GPU machine has no Ray).
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
# The device a test runs on: the CPU twin runs everywhere, the CUDA case where there is CUDA.
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_cuda])]
# What torch's sync debug mode says on each synchronizing CUDA call (c10's
# `warn_or_error_on_sync`): a blocking copy to or from the device, `.item()`, a stream sync.
SYNC_WARNING = "called a synchronizing CUDA operation"


# --- counting synchronizations --------------------------------------------------------------------


@dataclass
class SyncCount:
    """How many synchronizing CUDA calls a block made (`count`), filled in when it ends."""

    count: int = 0


@contextmanager
def counting_syncs() -> Iterator[SyncCount]:
    """Count the synchronizing CUDA calls made in the block.

    Under `torch.cuda.set_sync_debug_mode("warn")` each such call issues a `UserWarning`
    (`SYNC_WARNING`); every one is recorded (`"always"`: the same line warning at every step
    is counted at every step) and the others are ignored. What sync debug mode does not see
    (`torch.cuda.synchronize()`, `Event.synchronize()`, a copy from pageable memory that the
    driver stages) is not counted. Without CUDA the mode is left alone and only warnings
    raised with that text are counted (the CPU twin of the counter's test raises them).
    """
    result = SyncCount()
    previous = torch.cuda.get_sync_debug_mode() if HAS_CUDA else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if HAS_CUDA:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            yield result
        finally:
            if HAS_CUDA:
                torch.cuda.set_sync_debug_mode(previous)
    result.count = sum(SYNC_WARNING in str(warning.message) for warning in caught)


# --- policies whose outputs do not depend on the device -------------------------------------------


class PoleAnglePolicy(nn.Module):
    """CartPole: push towards the side the pole leans to, as a one-hot action.

    The score is `observation @ [0, 0, 1, 0]`: products by 0 and 1 and sums with zeros are
    exact in float32, so CUDA and the CPU pick the same action at every step (a random linear
    scorer may flip its arg-max between devices on a near tie). The direction is a parameter,
    so the policy has a device and `update_policy_weights_` has something to load.
    """

    def __init__(self, direction: float = 1.0) -> None:
        super().__init__()
        self.direction = nn.Parameter(torch.tensor([0.0, 0.0, direction, 0.0]))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        right = (observation * self.direction).sum(-1) > 0
        # The one-hot stacked by hand: no check of the class values, so no read-back (sync).
        return torch.stack((~right, right), -1).long()


def pole_angle_module(direction: float = 1.0) -> TensorDictModule:
    return TensorDictModule(
        PoleAnglePolicy(direction), in_keys=["observation"], out_keys=["action"]
    )


class CountingActorCritic(nn.Module):
    """For `CountingEnv`s of batch `[N]`: action 0, `sample_log_prob = 1000 * env + count`,
    `state_value = 2 * count + 1`; small integers, exact on any device. Its one parameter
    (`scale`, 1) gives it a device."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, ...]:
        count = observation[..., 0] * self.scale
        env_index = torch.arange(count.shape[0], dtype=count.dtype, device=count.device)
        action = torch.zeros(count.shape, dtype=torch.int64, device=count.device)
        return action, 1000 * env_index + count, 2 * observation * self.scale + 1


def counting_actor_critic() -> TensorDictModule:
    return TensorDictModule(
        CountingActorCritic(),
        in_keys=["observation"],
        out_keys=["action", "sample_log_prob", "state_value"],
    )


class NoisyPolicy(nn.Module):
    """Pendulum: `0 * observation + 0.1 * N(0, 1)`, drawn on the policy's device at every call;
    `calls` counts the forwards Python runs (a CUDA graph's replays run none)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 1)
        self.calls = 0

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        mean = 0.0 * self.linear(observation)
        return mean + 0.1 * torch.randn_like(mean)


# --- gauges ------------------------------------------------------------------------------------


def live_tensors() -> int:
    """How many tensors Python holds (after a full collection): a leak on any device shows."""
    gc.collect()
    return sum(isinstance(obj, torch.Tensor) for obj in gc.get_objects())


def differing_entries(mine: TensorDictBase, reference: TensorDictBase) -> list[str]:
    """The leaves where `mine` (any device) and `reference` differ in shape, dtype or value."""
    differ = []
    for key in reference.keys(include_nested=True, leaves_only=True):
        ours, theirs = mine.get(key), reference.get(key)
        if ours.shape != theirs.shape or ours.dtype != theirs.dtype:
            differ.append(f"{key}: {ours.shape} {ours.dtype} vs {theirs.shape} {theirs.dtype}")
        elif not torch.equal(ours.cpu(), theirs.cpu()):
            differ.append(f"{key}: values")
    return differ

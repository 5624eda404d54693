"""A policy a worker's Collector refuses is refused by its multi-process parent as the same
exception type, naming the worker, with the worker's traceback attached (TorchRL's tests
expect the TypeError from the constructor of every collector)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rlcollect import Collector
from rlcollect.collectors import MultiAsyncCollector, MultiSyncCollector
from rlcollect.envs import GymEnv
from rlcollect.errors import WorkerRaisedError

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]


class TwoInputs(nn.Module):
    """A module whose forward names an entry CartPole does not write."""

    def forward(self, observation: torch.Tensor, other_stuff: torch.Tensor) -> torch.Tensor:
        return observation


def cartpole() -> GymEnv:
    return GymEnv("CartPole-v1")


@pytest.mark.parametrize("collector_class", [MultiSyncCollector, MultiAsyncCollector])
def test_an_unwrappable_policy_is_a_type_error_from_the_constructor(collector_class) -> None:
    with pytest.raises(TypeError) as in_process:
        Collector(cartpole(), TwoInputs(), frames_per_batch=10)
    with pytest.raises(
        TypeError, match=r"worker \d failed: building the collector raised TypeError"
    ) as caught:
        collector_class([cartpole, cartpole], TwoInputs(), frames_per_batch=20)
    assert not isinstance(caught.value, WorkerRaisedError)
    assert str(in_process.value) in str(caught.value)  # the worker's own message
    cause = caught.value.__cause__
    assert isinstance(cause, WorkerRaisedError)
    assert cause.raised is TypeError
    assert "--- traceback in worker" in str(cause)
    assert "_match_in_keys" in cause.remote_traceback  # where the worker raised it


def failing_maker() -> GymEnv:
    raise OSError("no display")


def test_an_error_of_another_kind_stays_a_worker_error() -> None:
    """Only built-in exception types are raised as themselves; the rest keep the
    WorkerRaisedError (with the worker's type and message in its text)."""

    class EnvBrokeError(Exception):
        pass

    def broken_maker() -> GymEnv:
        raise EnvBrokeError("the pole broke")

    with pytest.raises(WorkerRaisedError, match="raised EnvBrokeError: the pole broke"):
        MultiSyncCollector([broken_maker], None, frames_per_batch=10)
    with pytest.raises(OSError, match=r"worker 0 failed: .*raised OSError: no display"):
        MultiSyncCollector([failing_maker], None, frames_per_batch=10)

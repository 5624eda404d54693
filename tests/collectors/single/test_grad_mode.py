"""The grad mode the collector calls the policy in: `torch.inference_mode` by default, never
leaking inference tensors into batches or into the parameters a learner trains."""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from rlcollect import Collector
from rlcollect.envs import GymEnv
from tests.collectors.policies import GreedyPolicy


class ModeRecorder(GreedyPolicy):
    """The greedy policy, noting the grad mode of every call."""

    def __init__(self) -> None:
        super().__init__()
        self.modes: set[tuple[bool, bool]] = set()

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        self.modes.add((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        return super().forward(observation)


def recorder_module(recorder: nn.Module) -> TensorDictModule:
    return TensorDictModule(recorder, in_keys=["observation"], out_keys=["action"])


@pytest.mark.parametrize("fast_path", [True, False])
def test_policy_runs_in_inference_mode_by_default(fast_path: bool) -> None:
    recorder = ModeRecorder()
    module = recorder_module(recorder)
    # a plain td -> td callable takes the general (TensorDict) path
    policy = module if fast_path else (lambda td: module(td))
    collector = Collector(GymEnv("CartPole-v1"), policy, frames_per_batch=20, total_frames=20)
    recorder.modes.clear()  # forget the construction-time probe
    batch = collector.next()
    assert recorder.modes == {(True, False)}
    for key in ("observation", "action", ("next", "reward"), ("collector", "traj_ids")):
        assert not batch[key].is_inference(), key
    collector.shutdown()


def test_inference_mode_false_keeps_no_grad() -> None:
    recorder = ModeRecorder()
    collector = Collector(
        GymEnv("CartPole-v1"),
        recorder_module(recorder),
        frames_per_batch=20,
        total_frames=20,
        inference_mode=False,
    )
    recorder.modes.clear()
    collector.next()
    assert recorder.modes == {(False, False)}
    collector.shutdown()


class LazyScorer(nn.Module):
    """A lazy linear scorer: its weights exist only after the first call."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.LazyLinear(2)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return nn.functional.one_hot(self.linear(observation).argmax(-1), 2)


def test_a_shared_policy_trains_after_collection_lazy_layers_included() -> None:
    """The learner's own module collects, then takes optimiser steps on the batch."""
    actor = LazyScorer()
    collector = Collector(
        GymEnv("CartPole-v1"),
        TensorDictModule(actor, in_keys=["observation"], out_keys=["action"]),
        frames_per_batch=32,
        total_frames=64,
    )
    assert not any(parameter.is_inference() for parameter in actor.parameters())
    optimizer = torch.optim.SGD(actor.parameters(), lr=0.1)
    for batch in collector:
        logits = actor.linear(batch["observation"])
        loss = nn.functional.cross_entropy(logits, batch["action"].argmax(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert actor.linear.weight.grad is not None
    collector.shutdown()


def test_inference_mode_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match=r"inference_mode must be True or False; got 'yes'"):
        Collector("CartPole-v1", frames_per_batch=10, inference_mode="yes")


def test_uninitialised_lazy_policies_stay_under_no_grad() -> None:
    from rlcollect.collectors.policy.resolve import has_lazy_parameters, policy_grad_mode

    lazy = LazyScorer()
    assert has_lazy_parameters(lazy)
    with policy_grad_mode(True, lazy):
        assert not torch.is_inference_mode_enabled()
    lazy(torch.zeros(4))
    assert not has_lazy_parameters(lazy)
    with policy_grad_mode(True, lazy):
        assert torch.is_inference_mode_enabled()
    with policy_grad_mode(False, lazy):
        assert not torch.is_inference_mode_enabled()
    assert not has_lazy_parameters(lambda td: td), "a plain callable has no parameters"

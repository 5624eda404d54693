"""TorchRL's ways of handing a collector its policy: `RandomPolicy()` without a spec, a plain
module wrapped with TorchRL's output names, and the error for one that cannot be wrapped; each
beside TorchRL's Collector."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from rlcollect import Collector
from rlcollect.envs import GymEnv

torchrl_collectors = pytest.importorskip("torchrl.collectors")
torchrl_envs = pytest.importorskip("torchrl.envs")
torchrl_modules = pytest.importorskip("torchrl.modules")
mocks = pytest.importorskip("torchrl.testing.mocking_classes")

COLLECTORS = {"ours": Collector, "torchrl": torchrl_collectors.Collector}
BOTH = pytest.mark.parametrize("name", list(COLLECTORS))


# --- RandomPolicy() without a spec -----------------------------------------------------------


@BOTH
def test_random_policy_without_a_spec_gets_the_torchrl_envs(name: str) -> None:
    policy = torchrl_modules.RandomPolicy()
    env = mocks.ContinuousActionVecMockEnv()
    collector = COLLECTORS[name](env, policy, frames_per_batch=10, total_frames=20)
    try:
        assert policy.action_spec is not None  # the user's instance was given the spec
        assert policy.action_spec == env.full_action_spec
        data = next(iter(collector))
        assert data["action"].shape == (10, env.full_action_spec["action"].shape[-1])
        assert data["action"].std() > 0
    finally:
        collector.shutdown()


@BOTH
def test_a_random_policy_factory_works_too(name: str) -> None:
    collector = COLLECTORS[name](
        mocks.ContinuousActionVecMockEnv,
        policy_factory=torchrl_modules.RandomPolicy,
        frames_per_batch=10,
        total_frames=20,
    )
    try:
        assert next(iter(collector))["action"].std() > 0
    finally:
        collector.shutdown()


def test_a_random_policy_on_our_env_keeps_no_spec_and_acts_at_random() -> None:
    """TorchRL's RandomPolicy draws from TorchRL specs: ours are not lent to it."""
    policy = torchrl_modules.RandomPolicy()
    collector = Collector(GymEnv("Pendulum-v1"), policy, frames_per_batch=10)
    assert policy.action_spec is None
    assert collector.next()["action"].std() > 0
    collector.shutdown()


# --- plain modules -------------------------------------------------------------------------------


class SeveralOutputs(nn.Module):
    """TorchRL's `WrappablePolicy`: an action and three more tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.LazyLinear(1)

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, ...]:
        output = self.linear(observation)
        return output, output.sum(), output.min(), output.max()


def pendulum(name: str) -> Any:
    return GymEnv("Pendulum-v1") if name == "ours" else torchrl_envs.GymEnv("Pendulum-v1")


@BOTH
def test_a_plain_module_is_wrapped_with_torchrls_output_names(name: str) -> None:
    policy = SeveralOutputs()
    policy(torch.zeros(3))  # initialise the lazy layer
    collector = COLLECTORS[name](pendulum(name), policy, frames_per_batch=20, total_frames=-1)
    try:
        data = collector.next()
        assert {"action", "output1", "output2", "output3"} <= set(data.keys())
        assert data["action"].shape == (20, 1)
        assert torch.allclose(data["output2"], data["action"].flatten())  # min of one
        assert (data["action"] != 0).any()
        for parameter in policy.parameters():
            parameter.data.zero_()
        collector.update_policy_weights_()
        assert (collector.next()["action"] == 0).all()
    finally:
        collector.shutdown()


class Unwrappable(nn.Module):
    """TorchRL's `UnwrappablePolicy`: its forward names an entry no env writes."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 1)

    def forward(
        self, observation: torch.Tensor, other_stuff: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.linear(observation), other_stuff.sum()


TORCHRL_WORDS = (
    "Arguments to policy.forward are incompatible with entries in|Failed to wrap the policy. "
    "If the policy needs to be trusted, set trust_policy=True."
)


@BOTH
def test_a_module_that_cannot_be_wrapped_is_refused_in_torchrls_words(name: str) -> None:
    with pytest.raises(TypeError, match=TORCHRL_WORDS):
        COLLECTORS[name](pendulum(name), Unwrappable(), frames_per_batch=20)


def test_our_refusal_says_what_was_expected_received_and_the_fix() -> None:
    with pytest.raises(
        TypeError,
        match=r"forward takes \['observation', 'other_stuff'\], when the env writes "
        r"\['observation'\] \(nothing for \['other_stuff'\]\)\. Name the forward arguments "
        r"after the observation keys, or wrap it yourself: TensorDictModule",
    ):
        Collector(GymEnv("Pendulum-v1"), Unwrappable(), frames_per_batch=20)

"""What the collector makes of its policy argument: random actions, wrapping, interaction type."""

from __future__ import annotations

import re

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import InteractionType, TensorDictModule
from tensordict.nn.probabilistic import interaction_type
from torch import nn

from rlcollect import Collector
from rlcollect.testing import CountingEnv
from tests.collectors.policies import GreedyPolicy, TwoObservationEnv


def test_no_policy_draws_random_actions_from_the_spec() -> None:
    env = CountingEnv(batch_size=(4,))
    collector = Collector(env, None, frames_per_batch=400, total_frames=400)
    actions = collector.next()["action"]
    assert actions.shape == (4, 100)
    assert env.action_spec.is_in(actions[:, 0])
    assert set(actions.unique().tolist()) == {0, 1}
    one_hot = Collector("CartPole-v1", None, frames_per_batch=200, total_frames=200).next()
    assert torch.equal(one_hot["action"].sum(-1), torch.ones(200, dtype=one_hot["action"].dtype))
    assert set(one_hot["action"].argmax(-1).unique().tolist()) == {0, 1}


class SpeedThenPosition(nn.Module):
    """Action 1 exactly when `speed` (all +1) and `position` (all -1) arrive by name."""

    def forward(self, speed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        return (speed.sum(-1) > position.sum(-1)).long()


class PositionThenSpeed(nn.Module):
    """The same rule with the arguments in the other order."""

    def forward(self, position: torch.Tensor, speed: torch.Tensor) -> torch.Tensor:
        return (speed.sum(-1) > position.sum(-1)).long()


@pytest.mark.parametrize(
    ("module_class", "in_keys"),
    [(SpeedThenPosition, ["speed", "position"]), (PositionThenSpeed, ["position", "speed"])],
)
def test_plain_module_reads_observation_keys_by_argument_name(
    module_class: type, in_keys: list[str]
) -> None:
    collector = Collector(TwoObservationEnv(), module_class(), frames_per_batch=8, total_frames=8)
    assert collector.policy.in_keys == in_keys
    assert collector.policy.out_keys == ["action"]
    data = collector.next()
    assert (data["action"] == 1).all(), "arguments were not matched to keys by name"


class Probe(nn.Module):
    """Records the interaction type it runs under; always action 0."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[InteractionType | None] = []

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        self.seen.append(interaction_type())
        return torch.zeros(observation.shape[:-1], dtype=torch.int64)


@pytest.mark.parametrize(
    "exploration_type",
    [InteractionType.DETERMINISTIC, InteractionType.MODE, InteractionType.RANDOM],
)
def test_policy_runs_under_the_exploration_type(exploration_type: InteractionType) -> None:
    probe = Probe()
    collector = Collector(
        CountingEnv(),
        TensorDictModule(probe, ["observation"], ["action"]),
        frames_per_batch=3,
        total_frames=3,
        exploration_type=exploration_type,
    )
    probe.seen.clear()
    collector.next()
    assert probe.seen == [exploration_type] * 3
    assert interaction_type() is None, "the interaction type leaked out of the batch"


def test_default_exploration_type_is_random() -> None:
    probe = Probe()
    collector = Collector(
        CountingEnv(),
        TensorDictModule(probe, ["observation"], ["action"]),
        frames_per_batch=2,
        total_frames=2,
    )
    probe.seen.clear()
    collector.next()
    assert probe.seen == [InteractionType.RANDOM] * 2


def biased(action: int) -> GreedyPolicy:
    """A greedy CartPole policy that always picks `action` (zero weights, one-hot bias)."""
    module = GreedyPolicy()
    with torch.no_grad():
        module.linear.weight.zero_()
        module.linear.bias.copy_(nn.functional.one_hot(torch.tensor(action), 2).float())
    return module


WEIGHT_FORMS = {
    "module": lambda module: module,
    "state_dict": lambda module: module.state_dict(),
    "tensordict": lambda module: TensorDict.from_module(module),
    "tensordict_module": lambda module: TensorDictModule(module, ["observation"], ["action"]),
    "tensordict_of_tensordict_module": lambda module: TensorDict.from_module(
        TensorDictModule(module, ["observation"], ["action"])
    ),
}


@pytest.mark.parametrize("form", sorted(WEIGHT_FORMS))
@pytest.mark.parametrize("wrapped", [False, True])
def test_update_policy_weights_accepts_every_form(form: str, wrapped: bool) -> None:
    policy: nn.Module = biased(0)
    if wrapped:
        policy = TensorDictModule(policy, ["observation"], ["action"])
    collector = Collector("CartPole-v1", policy, frames_per_batch=20, total_frames=40)
    assert (collector.next()["action"].argmax(-1) == 0).all()
    collector.update_policy_weights_(WEIGHT_FORMS[form](biased(1)))
    assert (collector.next()["action"].argmax(-1) == 1).all(), "the bias flip did not land"
    assert collector.policy_version == 1


@pytest.mark.parametrize("keyword", ["policy_or_weights", "weights", "policy"])
def test_update_policy_weights_takes_torchrl_keywords(keyword: str) -> None:
    collector = Collector("CartPole-v1", biased(0), frames_per_batch=20, total_frames=40)
    new = biased(1)
    collector.update_policy_weights_(**{keyword: new if keyword != "weights" else new.state_dict()})
    assert (collector.next()["action"].argmax(-1) == 1).all()


def test_update_policy_weights_refuses_two_sources() -> None:
    collector = Collector("CartPole-v1", biased(0), frames_per_batch=20, total_frames=40)
    with pytest.raises(ValueError, match=r"one of policy_or_weights, weights and policy; got"):
        collector.update_policy_weights_(biased(1), weights=biased(1).state_dict())
    assert collector.policy_version == 0


def test_update_policy_weights_refuses_other_types() -> None:
    collector = Collector("CartPole-v1", biased(0), frames_per_batch=20, total_frames=40)
    with pytest.raises(TypeError, match=r"takes None, an nn\.Module, a state dict .*got int"):
        collector.update_policy_weights_(42)


def test_an_action_that_misfits_the_spec_warns_once_naming_both() -> None:
    import warnings

    from tests.collectors.policies import greedy_module

    logits = TensorDictModule(torch.nn.Linear(4, 2), in_keys=["observation"], out_keys=["action"])
    message = (
        r"the policy writes 'action' as torch.float32 of shape \[2\] per frame, but the env's "
        r"action spec is torch.int64 of shape \[2\] \(OneHot\)"
    )
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        collector = Collector("CartPole-v1", logits, frames_per_batch=10)
        collector.next()
        collector.next()
        collector.shutdown()
    misfits = [str(w.message) for w in record if "policy writes" in str(w.message)]
    assert len(misfits) == 1
    assert re.search(message, misfits[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        Collector("CartPole-v1", greedy_module(), frames_per_batch=10).shutdown()

"""The RolloutBuffer's `action` field for a discrete env: `action_dim=1` holds the action's
index (as SB3's rollout buffer does), `action_dim=n` its one-hot, whichever encoding the env
takes; the env still receives its own encoding.

Real CartPole (`GymEnv`, one-hot by default) in a `SerialEnv`, through `Collector.collect`, as
the RolloutBuffer page runs it. Each Gymnasium env records the actions it is given, so the
stored field is checked against what the env received, and against the policy's decision.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl import data as torchrl

from rlcollect import Collector, GymEnv, SerialEnv
from rlcollect.collectors.single.action_field import DiscreteAction
from rlcollect.envs import specs as ours
from rlcollect.replay import RolloutBuffer

N, T = 3, 48  # CartPole episodes under this policy last about 10-30 steps: T crosses resets
OBS_DIM = 4


class Recorder(gym.Wrapper):
    """Keeps every action the Gymnasium env is given."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.actions: list[int] = []

    def step(self, action: Any) -> Any:
        self.actions.append(int(action))
        return super().step(action)


def decision(observation: torch.Tensor) -> torch.Tensor:
    """A pseudo-random index per observation (0 or 1), known from the stored `obs`."""
    return (observation[..., 1] * 1e4).long() % 2


class DecidingPolicy(nn.Module):
    """`decision(observation)`, one-hot or as an index: the env's own encoding."""

    def __init__(self, one_hot: bool) -> None:
        super().__init__()
        self.one_hot = one_hot

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        index = decision(observation)
        return nn.functional.one_hot(index, 2) if self.one_hot else index


def cartpole_collector(encoding: str) -> tuple[Collector, list[Recorder]]:
    """A `SerialEnv` of N CartPoles (one-hot or categorical actions) and their recorders."""
    recorders: list[Recorder] = []

    def make() -> GymEnv:
        recorders.append(Recorder(gym.make("CartPole-v1")))
        return GymEnv(recorders[-1], categorical_action_encoding=encoding == "categorical")

    env = SerialEnv(N, make)
    policy = TensorDictModule(
        DecidingPolicy(one_hot=encoding == "one-hot"), in_keys=["observation"], out_keys=["action"]
    )
    collector = Collector(env, policy, frames_per_batch=N * T)
    collector.set_seed(0)
    return collector, recorders


def received(recorders: list[Recorder]) -> torch.Tensor:
    """`[N, T]`: the indices the Gymnasium envs were given, then forgotten."""
    actions = torch.tensor([recorder.actions for recorder in recorders])
    for recorder in recorders:
        recorder.actions.clear()
    return actions


@pytest.mark.timeout(60)
@pytest.mark.parametrize("encoding", ["one-hot", "categorical"])
@pytest.mark.parametrize("action_dim", [1, 2])
def test_the_action_field_holds_the_index_or_the_one_hot_the_env_received(
    encoding: str, action_dim: int
) -> None:
    collector, recorders = cartpole_collector(encoding)
    buffer = RolloutBuffer(N, T, OBS_DIM, action_dim)
    for _ in range(2):  # the second rollout starts from the first one's last observation
        received(recorders)  # whatever the collector stepped before this rollout
        rollout = collector.collect(num_steps=T, rollout=buffer.start_rollout())
        buffer.add(rollout)
        rollout = buffer.get(flatten=False)
        given = received(recorders)
        assert given.shape == (N, T)
        assert rollout["done"][:, :T].any(), "the rollout crosses episode ends"
        assert rollout["action"].dtype == torch.float32
        stored = rollout["action"][:, :T]
        if action_dim == 1:
            assert torch.equal(stored, given.unsqueeze(-1).float()), "the index, as a float"
        else:
            assert torch.equal(stored, nn.functional.one_hot(given, 2).float()), "the one-hot"
        assert torch.equal(given, decision(rollout["obs"][:, :T])), "the policy's decisions"
    collector.shutdown()


@pytest.mark.gpu
@pytest.mark.timeout(60)
@pytest.mark.parametrize("action_dim", [1, 2])
def test_a_rollout_on_cuda_holds_the_actions_a_cpu_cartpole_received(action_dim: int) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    collector, recorders = cartpole_collector("one-hot")
    rollout = RolloutBuffer(N, T, OBS_DIM, action_dim, device="cuda").start_rollout()
    received(recorders)
    collector.collect(num_steps=T, rollout=rollout)
    given = received(recorders)
    expected = given.unsqueeze(-1) if action_dim == 1 else nn.functional.one_hot(given, 2)
    assert rollout["action"].is_cuda
    assert torch.equal(rollout["action"][:, :T].cpu(), expected.float())
    collector.shutdown()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("encoding", ["one-hot", "categorical"])
def test_an_action_field_of_another_size_is_refused_naming_both_that_fit(encoding: str) -> None:
    collector, _ = cartpole_collector(encoding)
    rollout = RolloutBuffer(N, T, OBS_DIM, action_dim=3).start_rollout()
    kind = "a one-hot action" if encoding == "one-hot" else "a categorical action"
    message = (
        rf"'action' is \(3, 49, 3\) torch.float32; .*{kind} of 2 choices: allocate it with "
        r"action_dim=1 \(the action's index\) or action_dim=2 \(its one-hot\)\."
    )
    with pytest.raises(ValueError, match=message):
        collector.collect(num_steps=T, rollout=rollout)
    assert not rollout["obs"].any(), "nothing written"
    assert collector.frames == 0
    collector.shutdown()


@pytest.mark.timeout(60)
def test_a_continuous_action_field_must_hold_every_number() -> None:
    env = SerialEnv(N, lambda: GymEnv("Pendulum-v1"))
    collector = Collector(env, None, frames_per_batch=N * T)
    rollout = RolloutBuffer(N, T, 3, action_dim=2).start_rollout()
    with pytest.raises(ValueError, match=r"1 number\(s\) per step: allocate it with action_dim=1"):
        collector.collect(num_steps=T, rollout=rollout)
    collector.shutdown()


ONE_HOT = DiscreteAction(2, torch.Size([]), is_one_hot=True)
CATEGORICAL = DiscreteAction(3, torch.Size([]), is_one_hot=False)
CATEGORICAL_PAIR = DiscreteAction(3, torch.Size([2]), is_one_hot=False)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (ours.OneHot(2, shape=(4, 2)), ONE_HOT),
        (ours.Categorical(3, shape=(4,)), CATEGORICAL),
        (ours.Categorical(3, shape=(4, 2)), CATEGORICAL_PAIR),
        (ours.Categorical([2, 3], shape=(4, 2)), None),  # MultiDiscrete: indices only
        (ours.Bounded(-1.0, 1.0, shape=(4, 2)), None),
        (torchrl.OneHot(2, shape=(4, 2)), ONE_HOT),
        (torchrl.Categorical(3, shape=(4,)), CATEGORICAL),
        (torchrl.Categorical(3, shape=(4, 2)), CATEGORICAL_PAIR),
        (torchrl.MultiOneHot([2, 3], shape=(4, 5)), None),
        (torchrl.MultiCategorical([2, 3], shape=(4, 2)), None),
        (torchrl.Bounded(-1.0, 1.0, shape=(4, 2)), None),
    ],
    ids=lambda value: type(value).__module__.split(".")[0] + "." + type(value).__name__,
)
def test_discrete_actions_of_our_specs_and_torchrl_s(
    spec: object, expected: DiscreteAction | None
) -> None:
    assert DiscreteAction.of(spec, batch_dims=1) == expected

"""`collector.env` is the env its user handed over, as in TorchRL: a TorchRL env is that env
itself (with the transforms the collector appended for a recurrent policy), never the adapter
our loop steps it through (`collector.stepped_env`); each case beside TorchRL's Collector."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rlcollect import Collector
from rlcollect.envs import GymEnv
from rlcollect.envs.torchrl_env import TorchRLEnv
from tests.collectors.policy.recurrent_policies import lstm_policy

torchrl_collectors = pytest.importorskip("torchrl.collectors")
torchrl_envs = pytest.importorskip("torchrl.envs")

pytestmark = pytest.mark.timeout(120)
OPTIONS = {"frames_per_batch": 10, "total_frames": 10}


def torchrl_cartpole() -> Any:
    return torchrl_envs.GymEnv("CartPole-v1")


def with_reward_sum() -> Any:
    return torchrl_envs.TransformedEnv(torchrl_cartpole(), torchrl_envs.RewardSum())


def both(make_env: Callable[[], Any], policy: Any = None, **options: Any) -> list[Any]:
    """`(env, collector)` for ours and TorchRL's, each over an env of its own, after a batch."""
    pairs = []
    for collector_class in (Collector, torchrl_collectors.Collector):
        env = make_env()
        collector = collector_class(env, policy, **OPTIONS, **options)
        next(iter(collector))
        pairs.append((env, collector))
    return pairs


def transform_names(env: Any) -> list[str]:
    return [type(transform).__name__ for transform in env.transform]


@pytest.mark.parametrize("make_env", [torchrl_cartpole, with_reward_sum])
def test_a_torchrl_env_is_handed_back_itself(make_env: Callable[[], Any]) -> None:
    for env, collector in both(make_env):
        try:
            assert collector.env is env
            assert isinstance(collector.env, torchrl_envs.EnvBase)
            assert collector.getattr_env("batch_size") == env.batch_size
        finally:
            collector.shutdown()
    # The loop steps it through our adapter, kept to the collector.
    collector = Collector(make_env(), None, **OPTIONS)
    try:
        assert isinstance(collector.stepped_env, TorchRLEnv)
    finally:
        collector.shutdown()


def test_a_recurrent_policys_transforms_are_appended_to_the_users_env() -> None:
    policy, _ = lstm_policy()
    (plain, ours), (_, theirs) = both(
        torchrl_cartpole, policy, auto_register_policy_transforms=True
    )
    try:
        for collector in (ours, theirs):
            assert isinstance(collector.env, torchrl_envs.TransformedEnv)
            assert transform_names(collector.env) == ["InitTracker", "TensorDictPrimer"]
        assert ours.env.base_env is plain
        assert "is_init" in ours.env.observation_spec
    finally:
        ours.shutdown()
        theirs.shutdown()


def test_appended_to_a_transformed_env_the_users_env_is_handed_back() -> None:
    policy, _ = lstm_policy()
    pairs = both(with_reward_sum, policy, auto_register_policy_transforms=True)
    try:
        for env, collector in pairs:
            # TorchRL appends to the user's TransformedEnv in place: it is the same object.
            assert collector.env is env
            assert transform_names(env) == ["RewardSum", "InitTracker", "TensorDictPrimer"]
            assert collector.getattr_env("transform") is env.transform
    finally:
        for _, collector in pairs:
            collector.shutdown()


def test_with_max_frames_per_traj_the_users_env_without_the_step_limit() -> None:
    # TorchRL wraps the env in a TransformedEnv with a StepCounter; ours limits the steps in
    # its own wrapper, below `collector.env`: the user's env comes back as it was given.
    (env, ours), (_, theirs) = both(with_reward_sum, max_frames_per_traj=5)
    try:
        assert ours.env is env
        assert transform_names(theirs.env)[-1] == "StepCounter"
    finally:
        ours.shutdown()
        theirs.shutdown()


def test_one_of_our_envs_is_the_env_the_loop_steps() -> None:
    env = GymEnv("CartPole-v1")
    collector = Collector(env, None, **OPTIONS)
    try:
        assert collector.env is env is collector.stepped_env
    finally:
        collector.shutdown()

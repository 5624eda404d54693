"""Tests for the container protocol: transforms ask their container (the transformed env, or a
`Compose` that forwards the question up) for the env they see."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from rlcollect.envs import EnvBase, GymEnv
from rlcollect.errors import MisuseError
from rlcollect.keys import EPISODE_REWARD, STEP_COUNT
from rlcollect.transforms import Compose, RewardSum, StepCounter, Transform, TransformedEnv


class CountingViews(TransformedEnv):
    """A transformed env that records the views its transforms ask it for."""

    asked: list[int]

    def view_through(self, env: EnvBase, transforms: Sequence[Transform]) -> TransformedEnv:
        self.__dict__.setdefault("asked", []).append(len(transforms))
        return super().view_through(env, transforms)


def test_a_nested_compose_forwards_the_view_to_the_transformed_env() -> None:
    summed = RewardSum()
    inner = Compose(StepCounter(), summed)
    env = CountingViews(GymEnv("CartPole-v1"), Compose(RewardSum(out_keys=["outer_sum"]), inner))
    env.asked.clear()
    inner.clear_views()
    seen = summed.parent
    assert seen is not None
    assert env.asked == [1]  # [StepCounter], asked of the env through the nested Compose
    assert STEP_COUNT in seen.observation_spec
    assert "outer_sum" in seen.observation_spec
    assert EPISODE_REWARD not in seen.observation_spec


def test_the_first_transform_sees_the_base_env() -> None:
    base = GymEnv("CartPole-v1")
    counter = StepCounter()
    env = TransformedEnv(base, counter)
    assert env.env_before(env.transform) is base
    assert counter.parent is base


def test_a_detached_compose_cannot_build_views() -> None:
    with pytest.raises(MisuseError, match=r"not attached to an env.*TransformedEnv\(env, Compose"):
        Compose(StepCounter()).view_through(GymEnv("CartPole-v1"), [StepCounter()])

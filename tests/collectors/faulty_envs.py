"""Real Gymnasium envs that fail on purpose inside worker processes."""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np

from rlcollect.envs import GymEnv


class FailingStepEnv(gym.Env):
    """A one-number env whose step `fail_at` raises, or hangs with `hang=True`."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, fail_at: int, hang: bool = False) -> None:
        self.fail_at, self.hang, self.steps = fail_at, hang, 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.steps += 1
        if self.steps == self.fail_at:
            if self.hang:
                time.sleep(3600)
            raise ValueError(f"the env broke at step {self.steps}")
        return np.full(1, self.steps, np.float32), 1.0, False, False, {}


class SlowStepEnv(FailingStepEnv):
    """A healthy one-number env whose every step takes `seconds`."""

    def __init__(self, seconds: float) -> None:
        super().__init__(fail_at=-1)
        self.seconds = seconds

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        time.sleep(self.seconds)
        return super().step(action)


def slow_env(seconds: float) -> GymEnv:
    return GymEnv(SlowStepEnv(seconds))


def failing_env(fail_at: int) -> GymEnv:
    return GymEnv(FailingStepEnv(fail_at))


def hanging_env(hang_at: int) -> GymEnv:
    return GymEnv(FailingStepEnv(hang_at, hang=True))


def healthy_env() -> GymEnv:
    return GymEnv(FailingStepEnv(fail_at=-1))

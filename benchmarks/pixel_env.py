"""A Gymnasium env with Atari-sized observations, for benchmarks that need pixels without ROMs.

Each observation is 4 stacked 84x84 uint8 frames (what Atari preprocessing hands CleanRL's
Nature CNN), cut from a fixed pool of noise frames so that a step costs a copy, as a cheap
emulator step would; 6 discrete actions as Pong; episodes end (truncated) after
`episode_length` steps. Both our `GymEnv` and TorchRL's build it by its registered id.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

ENV_ID = "rlcollect-bench/StackedFrames-v0"
FRAME_POOL = 64
STACK, SIZE, ACTIONS = 4, 84, 6


class StackedFramesEnv(gym.Env):
    """4x84x84 uint8 observations, `Discrete(6)` actions, reward 1 when the action matches
    the step number modulo 6."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, episode_length: int = 1000) -> None:
        self.observation_space = gym.spaces.Box(0, 255, (STACK, SIZE, SIZE), np.uint8)
        self.action_space = gym.spaces.Discrete(ACTIONS)
        self.episode_length = episode_length
        pool = np.random.default_rng(0).integers(0, 256, (FRAME_POOL + STACK, SIZE, SIZE))
        self._frames = pool.astype(np.uint8)
        self._step = 0

    def _observation(self) -> np.ndarray:
        start = self._step % FRAME_POOL
        return self._frames[start : start + STACK].copy()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._step = 0
        return self._observation(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self._step += 1
        reward = float(int(action) == self._step % ACTIONS)
        return self._observation(), reward, False, self._step >= self.episode_length, {}


def register() -> str:
    """Register the env with Gymnasium (once per process) and give its id."""
    if ENV_ID not in gym.registry:
        gym.register(ENV_ID, entry_point=StackedFramesEnv)
    return ENV_ID

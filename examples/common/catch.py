"""`Catch`: a tiny Gymnasium env with image observations (bsuite's catch), needing no renderer.

Registered as `Catch-v0`; configs name it `common.catch:Catch-v0`, so Gymnasium imports this
module wherever the env is made (in worker processes too).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

LEFT, STAY, RIGHT = 0, 1, 2


class Catch(gym.Env):
    """A ball falls one row a step from a random column; the paddle on the bottom row moves
    left, stays or moves right. Reward +1 for a catch, -1 for a miss, at the last step.

    Observations are `[rows * pixel_size, columns * pixel_size, 1]` uint8 images (ball and
    paddle at 255). An episode lasts `rows - 1` steps; a random policy returns about -0.6 and
    the best one 1.0.

    Examples:
        >>> env = Catch(rows=6, columns=4)
        >>> observation, _ = env.reset(seed=0)
        >>> observation.shape, observation.dtype
        ((6, 4, 1), dtype('uint8'))
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(
        self,
        rows: int = 10,
        columns: int = 5,
        pixel_size: int = 1,
        render_mode: str | None = None,
    ) -> None:
        if rows < 2 or columns < 1 or pixel_size < 1:
            raise ValueError(
                f"Catch needs rows >= 2, columns >= 1 and pixel_size >= 1; got rows={rows}, "
                f"columns={columns}, pixel_size={pixel_size}."
            )
        self.rows, self.columns, self.pixel_size = rows, columns, pixel_size
        self.render_mode = render_mode
        shape = (rows * pixel_size, columns * pixel_size, 1)
        self.observation_space = gym.spaces.Box(0, 255, shape, dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self._ball = (0, 0)
        self._paddle = columns // 2

    def _observation(self) -> np.ndarray:
        board = np.zeros((self.rows, self.columns, 1), dtype=np.uint8)
        board[self._ball[0], self._ball[1]] = 255
        board[self.rows - 1, self._paddle] = 255
        if self.pixel_size > 1:
            board = board.repeat(self.pixel_size, axis=0).repeat(self.pixel_size, axis=1)
        return board

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._ball = (0, int(self.np_random.integers(self.columns)))
        self._paddle = self.columns // 2
        return self._observation(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        move = int(action) - 1
        self._paddle = min(max(self._paddle + move, 0), self.columns - 1)
        self._ball = (self._ball[0] + 1, self._ball[1])
        terminated = self._ball[0] == self.rows - 1
        reward = 0.0
        if terminated:
            reward = 1.0 if self._ball[1] == self._paddle else -1.0
        return self._observation(), reward, terminated, False, {}

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        return self._observation().repeat(3, axis=-1)


if "Catch-v0" not in gym.registry:
    gym.register(id="Catch-v0", entry_point=f"{__name__}:Catch")

"""`StepCounter`: counts the steps since the last reset and truncates at `max_steps`."""

from __future__ import annotations

import numbers

import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.envs.specs import Bounded, Categorical, Composite
from rlcollect.transforms.base import Transform


class StepCounter(Transform):
    """Writes `"step_count"` (`[1]` int64): 0 at the reset root, `t + 1` under `"next"` after
    step t. With `max_steps`, the step that reaches it sets `truncated` and `done` to True, as
    TorchRL's `StepCounter` does. Collectors apply the same rule with `StepLimit`
    (step_limit.py), its buffer-first twin for `max_frames_per_traj`.

    Args:
        max_steps: truncate episodes after this many steps (never when None).
        truncated_key: the flag set at `max_steps`.
        step_count_key: where the count is written.

    Examples:
        >>> from rlcollect.envs import GymEnv
        >>> from rlcollect.transforms import TransformedEnv
        >>> env = TransformedEnv(GymEnv("CartPole-v1"), StepCounter(max_steps=3))
        >>> _ = env.set_seed(0)
        >>> root = env.reset()
        >>> int(root["step_count"])
        0
        >>> data = env.rollout(5)
        >>> data["next", "step_count"].squeeze(-1), data["next", "done"].squeeze(-1)
        (tensor([1, 2, 3]), tensor([False, False,  True]))
    """

    def __init__(
        self,
        max_steps: int | None = None,
        truncated_key: str = keys.TRUNCATED,
        step_count_key: str = keys.STEP_COUNT,
    ) -> None:
        if max_steps is not None and (
            isinstance(max_steps, bool)
            or not isinstance(max_steps, numbers.Integral)
            or max_steps < 1
        ):
            raise ValueError(
                f"max_steps must be a positive integer or None; got {max_steps!r}. "
                "Use max_steps=None to count without truncating."
            )
        for name, value in (("truncated_key", truncated_key), ("step_count_key", step_count_key)):
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a string; got {value!r}.")
        super().__init__(in_keys=[], out_keys=[step_count_key])
        self.max_steps = max_steps
        self.truncated_key = truncated_key
        self.step_count_key = step_count_key

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        done = tensordict_reset.get(keys.DONE)
        tensordict_reset.set(self.step_count_key, torch.zeros_like(done, dtype=torch.int64))
        if self.max_steps is not None and self.truncated_key not in tensordict_reset:
            tensordict_reset.set(self.truncated_key, torch.zeros_like(done))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        step_count = tensordict.get(self.step_count_key, None)
        if step_count is None:
            raise KeyError(
                f"StepCounter found no {self.step_count_key!r} in the tensordict given to "
                "step; step from the root that reset() or step_and_maybe_reset() returned."
            )
        next_count = step_count + 1
        next_tensordict.set(self.step_count_key, next_count)
        if self.max_steps is not None:
            truncated = next_count >= self.max_steps
            previous = next_tensordict.get(self.truncated_key, None)
            if previous is not None:
                truncated = truncated | previous
            next_tensordict.set(self.truncated_key, truncated)
            next_tensordict.set(keys.DONE, next_tensordict.get(keys.DONE) | truncated)
        return next_tensordict

    def transform_done_spec(self, done_spec: Composite) -> Composite:
        if self.max_steps is not None and self.truncated_key not in done_spec:
            flag = done_spec[keys.DONE]
            done_spec[self.truncated_key] = Categorical(
                2, shape=flag.shape, dtype=torch.bool, device=flag.device
            )
        return done_spec

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        flag = self.require_parent().done_spec[keys.DONE]
        observation_spec[self.step_count_key] = Bounded(
            low=0,
            high=torch.iinfo(torch.int64).max,
            shape=flag.shape,
            dtype=torch.int64,
            device=flag.device,
        )
        return observation_spec

    def __repr__(self) -> str:
        return f"StepCounter(max_steps={self.max_steps})"

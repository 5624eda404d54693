"""`StepLimit`: a buffer-first env wrapper that counts steps and truncates long trajectories.

The collector wraps the env in it for `max_frames_per_traj`: it writes `"step_count"` (root and
`"next"`), and marks `("next", "truncated")` and `("next", "done")` at the limit, so the wrapped
env's `advance_into` resets the sub-env as for any other done step. An env without a truncated
flag gets one, as TorchRL's `StepCounter` adds it.

It is the buffer-first twin of `StepCounter` (step_counter.py), for speed: the same semantics
written on carrier slots instead of TensorDicts. tests/transforms/test_step_limit_conformance.py
runs both on the same envs and checks that they agree step by step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.envs.base import EnvBase
from rlcollect.envs.specs import Composite, Unbounded, spec_leaves


def _root_name(key: Any) -> str | None:
    """`key`'s name when it is at the root (`"done"` or `("done",)`), else None."""
    if isinstance(key, str):
        return key
    return key[0] if len(key) == 1 else None


def has_truncated_flag(env: Any, at_root: bool = True) -> bool:
    """Whether `env` has a root `"truncated"` flag (with `at_root=False`: one in any group)."""
    if at_root:
        return keys.TRUNCATED in [_root_name(key) for key in env.done_keys]
    return any(
        (key if isinstance(key, str) else key[-1]) == keys.TRUNCATED for key in env.done_keys
    )


def require_truncated_flag(env: Any, option: str) -> None:
    """Raise a ValueError naming `option` unless `env` has a `"truncated"` flag."""
    if not has_truncated_flag(env, at_root=False):
        raise ValueError(
            f"{option} marks steps truncated, but the env has no 'truncated' flag (its done "
            f"keys are {list(env.done_keys)}); add one to its done_spec or drop {option}."
        )


class StepLimit(EnvBase):
    """Counts steps per sub-env and truncates a trajectory after `max_steps` steps.

    Semantics follow TorchRL's `StepCounter`: the root `step_count` is 0 after a reset, the
    `("next", "step_count")` of the first step is 1. With `soft=True` (RLlib's soft horizon)
    the limit sets `truncated` but not `done`: the env goes on, and the count starts again.
    """

    def __init__(self, env: EnvBase, max_steps: int, soft: bool = False) -> None:
        if keys.STEP_COUNT in env.observation_spec:
            raise ValueError(
                "max_frames_per_traj is set but the env already counts steps (it has a "
                f"'{keys.STEP_COUNT}' key); drop its StepCounter or unset max_frames_per_traj."
            )
        if max_steps < 1:
            raise ValueError(f"max_frames_per_traj must be >= 1; got {max_steps}.")
        nested = [key for key in env.done_keys if _root_name(key) is None]
        if nested:
            raise ValueError(
                f"max_frames_per_traj={max_steps} counts steps per sub-env, but the env has "
                f"done flags in groups {nested}; the limit is supported for envs whose flags "
                "are all at the root. Add a step counter to the env itself (e.g. TorchRL's "
                "StepCounter(max_steps=...)) instead."
            )
        super().__init__(env.batch_size, env.device)
        self.env = env
        self.max_steps = max_steps
        # A soft horizon (RLlib's): truncated at the limit, but not done, so no reset.
        self.soft = soft
        # A spec of ours whatever the env's (a TorchRL env keeps TorchRL specs).
        self.observation_spec = Composite(shape=env.batch_size, device=env.device)
        for key, leaf in spec_leaves(env.observation_spec):
            self.observation_spec[key] = leaf
        shape = (*env.batch_size, 1)
        self.observation_spec[keys.STEP_COUNT] = Unbounded(shape=shape, dtype=torch.int64)
        self.action_spec = env.action_spec
        self.reward_spec = env.reward_spec
        # As TorchRL's StepCounter does, an env without a truncated flag gets one: only this
        # wrapper writes it then (the env never does), so it is set, not OR-ed, every step.
        self.writes_truncated = not has_truncated_flag(env)
        self.done_spec = Composite(shape=env.batch_size, device=env.device)
        for key, leaf in spec_leaves(env.done_spec):
            self.done_spec[key] = leaf
        if self.writes_truncated:
            self.done_spec[keys.TRUNCATED] = self.done_spec[keys.DONE].clone()

    @property
    def observation_keys(self) -> list[tuple[str, ...]]:
        return [*self.env.observation_keys, (keys.STEP_COUNT,)]

    @property
    def keeps_no_device(self) -> bool:
        return bool(getattr(self.env, "keeps_no_device", False))

    @property
    def action_keys(self) -> list[Any]:
        return self.env.action_keys

    @property
    def reward_keys(self) -> list[Any]:
        return self.env.reward_keys

    @property
    def group_map(self) -> dict[str, list[str]]:
        return self.env.group_map

    @property
    def agents_per_step(self) -> int:
        return self.env.agents_per_step

    @property
    def full_action_spec(self) -> Any:
        return self.env.full_action_spec

    def fake_tensordict(self) -> TensorDictBase:
        """The wrapped env's frame (its own key layout) with the step counts, and the
        truncated flags when this wrapper adds them."""
        frame = self.env.fake_tensordict()
        count = torch.zeros((*self.batch_size, 1), dtype=torch.int64, device=self.device)
        frame.set(keys.STEP_COUNT, count)
        frame.set((keys.NEXT, keys.STEP_COUNT), count.clone())
        if self.writes_truncated:
            for key in (keys.TRUNCATED, (keys.NEXT, keys.TRUNCATED)):
                frame.set(key, torch.zeros_like(frame.get(keys.DONE)))
        return frame

    def _bind(self, carrier: TensorDictBase) -> None:
        self.env.bind(carrier)
        time_dim = len(self.batch_size)
        next_td = carrier.get(keys.NEXT)
        self._root_count = carrier.get(keys.STEP_COUNT)
        self._time_dim = time_dim
        self._next_count = next_td.get(keys.STEP_COUNT)
        self._next_truncated = next_td.get(keys.TRUNCATED)
        self._next_done = next_td.get(keys.DONE)
        # A reset clears the root step count, and the root truncated flag when this wrapper
        # adds it (the env clears only the flags it knows).
        self._cleared_at_reset = [self._root_count]
        if self.writes_truncated:
            self._cleared_at_reset.append(carrier.get(keys.TRUNCATED))

    def _at(self, tensor: torch.Tensor, t: int) -> torch.Tensor:
        return tensor.select(self._time_dim, t)

    def reset_into(self, t: int, mask: torch.Tensor | None = None) -> None:
        self.env.reset_into(t, mask)
        for tensor in self._cleared_at_reset:
            value = self._at(tensor, t)
            if mask is None:
                value.zero_()
            else:
                value.masked_fill_(mask.reshape(value.shape[:-1]).unsqueeze(-1), 0)

    def step_into(self, t: int) -> None:
        self.env.step_into(t)
        count = self._at(self._next_count, t)
        torch.add(self._at(self._root_count, t), 1, out=count)
        truncated = self._at(self._next_truncated, t)
        if self.writes_truncated:
            torch.ge(count, self.max_steps, out=truncated)
        else:
            truncated.logical_or_(count >= self.max_steps)
        if not self.soft:
            self._at(self._next_done, t).logical_or_(truncated)

    def advance_into(self, t: int) -> None:
        self._at(self._root_count, t + 1).copy_(self._at(self._next_count, t))
        self.env.advance_into(t)
        restart = self._at(self._next_done, t)
        if self.soft:  # a new (logical) episode starts at the horizon, without a reset
            restart = restart | (self._at(self._next_count, t) >= self.max_steps)
        self._at(self._root_count, t + 1).masked_fill_(restart, 0)

    def set_seed(self, seed: int) -> int:
        return self.env.set_seed(seed)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped env's state (its transforms' buffers), or `{}` when it keeps none."""
        return self.env.state_dict() if hasattr(self.env, "state_dict") else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict()` returned into the wrapped env."""
        if state and hasattr(self.env, "load_state_dict"):
            self.env.load_state_dict(state)

    def close(self) -> None:
        self.env.close()
        super().close()

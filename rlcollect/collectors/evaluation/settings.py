"""`EvaluationSettings`: how every evaluation runs, checked once, the same on every backend.

The settings travel to a worker process or a Ray actor with the env and policy factories, so
they hold plain values and the user's callables only.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict.nn import InteractionType

from rlcollect import keys
from rlcollect.envs.base import EnvBase
from rlcollect.envs.torchrl_env import is_torchrl_env

NestedKey = str | tuple[str, ...]
# Steps per sub-env of an internal batch when frames_per_batch is not given: an evaluation
# collects whole batches, so it stops at most this many steps after its last episode ends.
DEFAULT_STEPS_PER_BATCH = 64
# Options of the internal collector that the evaluator sets itself.
OWN_COLLECTOR_OPTIONS = (
    "frames_per_batch",
    "total_frames",
    "max_frames_per_traj",
    "exploration_type",
    "policy_factory",
    "interruptor",
    "replay_buffer",
    "batch_mode",
)
TRAJ_FORMATS = ("padded", "cat")


def is_env(candidate: Any) -> bool:
    """Whether `candidate` is an env instance (ours or TorchRL's) rather than a factory."""
    return isinstance(candidate, EnvBase) or is_torchrl_env(candidate)


def build_policy(policy_factory: Callable[..., Any], env: Any, *, with_env: bool = True) -> Any:
    """The policy `policy_factory` builds for `env`.

    TorchRL calls it `policy_factory(env)` in this process and in a Ray actor
    (`with_env=True`), and `policy_factory()` in a worker process (`with_env=False`); either
    way, a factory that cannot be called so is called the other way (`lambda: make()` is
    called with no argument, `lambda env: make(env)` with the env).
    """
    takes_env = _accepts(policy_factory, env)
    takes_nothing = _accepts(policy_factory)
    if (with_env and takes_env) or not takes_nothing:
        return policy_factory(env)
    return policy_factory()


def _accepts(function: Callable[..., Any], *args: Any) -> bool:
    """Whether `function` can be called with `args` (True when its signature is unknown)."""
    try:
        inspect.signature(function).bind(*args)
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin)
        return True
    return True


def _positive_or_none(argument: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{argument} must be a positive integer or None; got {value!r}.")
    return value


@dataclass(frozen=True)
class EvaluationSettings:
    """How an evaluation collects its episodes and measures them (see `Evaluator`)."""

    num_trajectories: int = 10
    max_steps: int | None = None
    frames_per_batch: int | None = None  # None: see `steps_per_batch`
    exploration_type: InteractionType = InteractionType.DETERMINISTIC
    collector_kwargs: dict[str, Any] = field(default_factory=dict)
    traj_format: str = "padded"
    reward_key: NestedKey = (keys.NEXT, keys.REWARD)
    end_keys: tuple[NestedKey, ...] = (keys.DONE, keys.TRUNCATED)
    metrics_fn: Callable[..., Mapping[str, Any]] | None = None
    dump_video: bool = True
    seed: int | None = None

    @classmethod
    def validate(
        cls,
        *,
        num_trajectories: Any,
        max_steps: Any,
        frames_per_batch: Any,
        exploration_type: Any,
        collector_kwargs: Mapping[str, Any] | None,
        reward_keys: NestedKey,
        done_keys: NestedKey,
        metrics_fn: Any,
        dump_video: bool,
        seed: int | None = None,
    ) -> EvaluationSettings:
        """The settings of TorchRL's arguments, each checked (a ValueError or TypeError names
        the argument, the value and what is accepted)."""
        if _positive_or_none("num_trajectories", num_trajectories) is None:
            raise ValueError("num_trajectories must be a positive integer; got None.")
        max_steps = _positive_or_none("max_steps", max_steps)
        frames = _positive_or_none("frames_per_batch", frames_per_batch)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None; got {seed!r}.")
        if metrics_fn is not None and not callable(metrics_fn):
            raise TypeError(f"metrics_fn must be a callable batch -> dict; got {metrics_fn!r}.")
        options = dict(collector_kwargs or {})
        taken = sorted(name for name in OWN_COLLECTOR_OPTIONS if name in options)
        if taken:
            raise ValueError(
                f"collector_kwargs sets {taken}, which the Evaluator sets itself; pass "
                "frames_per_batch, max_steps and exploration_type to the Evaluator instead."
            )
        options.pop("trajs_per_batch", None)  # always num_trajectories
        traj_format = options.pop("traj_format", None) or "padded"
        if traj_format not in TRAJ_FORMATS:
            raise ValueError(
                f"collector_kwargs['traj_format'] must be one of {TRAJ_FORMATS}; got "
                f"{traj_format!r}."
            )
        return cls(
            num_trajectories=num_trajectories,
            max_steps=max_steps,
            frames_per_batch=frames,
            exploration_type=InteractionType(exploration_type),
            collector_kwargs=options,
            traj_format=traj_format,
            reward_key=reward_keys,
            end_keys=_end_keys(done_keys),
            metrics_fn=metrics_fn,
            dump_video=bool(dump_video),
            seed=seed,
        )

    def frames_per_batch_for(self, env: Any) -> int:
        """The internal batch's frames for `env`: `frames_per_batch`, else
        `min(max_steps, 64)` steps of every sub-env; rounded up to whole env steps."""
        numel = max(1, torch.Size(env.batch_size).numel())
        frames = self.frames_per_batch
        if frames is None:
            frames = min(self.max_steps or DEFAULT_STEPS_PER_BATCH, DEFAULT_STEPS_PER_BATCH) * numel
        return -(-frames // numel) * numel


def _end_keys(done_keys: NestedKey) -> tuple[NestedKey, ...]:
    """The flags that end an episode, under `"next"` (TorchRL's `("next", "done")` given as
    such): the done key, and the truncation a step limit sets."""
    key = (done_keys,) if isinstance(done_keys, str) else tuple(done_keys)
    if key and key[0] == keys.NEXT:
        key = key[1:]
    if not key:
        raise ValueError(f"done_keys must name a flag under 'next'; got {done_keys!r}.")
    end = key[0] if len(key) == 1 else key
    return (end,) if end == keys.TRUNCATED else (end, keys.TRUNCATED)

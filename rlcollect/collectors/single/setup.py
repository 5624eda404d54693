"""The `Collector`'s arguments turned into checked values and parts, before the loop is built.

Each function takes one family of arguments (the loop's own, RLlib's horizons and episode
modes, the batch's size), checks them with an error naming the argument, and returns what the
collector composes: a wrapped env, a `Horizon`, an `EpisodeMode`, a batch geometry.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rlcollect.collectors.sampling.horizon import Horizon, frames_per_env_step
from rlcollect.collectors.sampling.whole_episodes import EpisodeMode, refuse_with_whole_episodes
from rlcollect.collectors.weights.schemes import check_schemes
from rlcollect.transforms.step_limit import StepLimit, require_truncated_flag


def policy_from_factory(policy: Any, policy_factory: Callable[[], Any] | None) -> Any:
    """The policy, or what `policy_factory()` builds (TorchRL's `policy_factory`)."""
    if policy_factory is None:
        return policy
    if policy is not None:
        raise TypeError("policy_factory cannot be used with policy; pass one of the two.")
    if not callable(policy_factory):
        raise TypeError(
            f"policy_factory must be a callable returning a policy; got {policy_factory!r}."
        )
    return policy_factory()


def check_loop_arguments(
    *,
    reset_when_done: Any,
    inference_mode: Any,
    pre_collect_hook: Any,
    use_buffers: Any,
    trust_policy: Any,
) -> None:
    """The loop's own arguments, and TorchRL's that mean nothing here (accepted as no-ops
    where they can be)."""
    if reset_when_done is not True:
        raise ValueError(
            f"reset_when_done={reset_when_done!r} is not supported: a done sub-env is "
            "always reset (stepping a finished Gymnasium env is undefined). Leave "
            "reset_when_done=True."
        )
    if not isinstance(inference_mode, bool):
        raise TypeError(
            f"inference_mode must be True or False; got {inference_mode!r} "
            f"({type(inference_mode).__name__})."
        )
    if pre_collect_hook is not None and not callable(pre_collect_hook):
        raise TypeError(
            f"pre_collect_hook must be a callable taking no argument; got {pre_collect_hook!r}."
        )
    # use_buffers=False: TorchRL stacks the steps instead of writing a preallocated buffer,
    # for envs whose specs change; the batches are the same, so it is accepted.
    for name, value in (("use_buffers", use_buffers), ("trust_policy", trust_policy)):
        if value not in (None, True, False):
            raise TypeError(f"{name} must be True, False or None; got {value!r}.")


def check_torchrl_arguments(*, no_cuda_sync: Any, local_init_rb: Any, interruptor: Any) -> None:
    """TorchRL's arguments about CUDA, buffers and weights: accepted where they mean here
    what they mean in TorchRL, refused (saying what to use) where they cannot."""
    if not isinstance(no_cuda_sync, bool):
        raise TypeError(f"no_cuda_sync must be True or False; got {no_cuda_sync!r}.")
    # TorchRL 0.14 always initialises a replay buffer's storage where it is first written
    # (local_init_rb is forced to True); so does every storage here. Nothing to switch.
    if local_init_rb not in (None, True, False):
        raise TypeError(f"local_init_rb must be True, False or None; got {local_init_rb!r}.")
    if interruptor is not None and not callable(getattr(interruptor, "collection_stopped", None)):
        raise TypeError(
            "interruptor must have a collection_stopped() method returning True once the "
            f"batch should end (as TorchRL's _Interruptor); got {type(interruptor).__name__}."
        )


@dataclass(frozen=True)
class Sampling:
    """RLlib's horizons and episode modes, checked together (they constrain each other)."""

    env: Any  # the env, wrapped in a `StepLimit` when trajectories are limited
    horizon: Horizon
    episode_mode: EpisodeMode | None

    @classmethod
    def build(
        cls,
        env: Any,
        *,
        max_frames_per_traj: int | None,
        soft_horizon: bool,
        no_done_at_end: bool,
        set_truncated: bool,
        episode_options: dict[str, Any],
        frames_per_batch: int,
        has_buffer: bool,
        return_same_td: bool,
        reset_at_each_iter: bool,
        split_trajs: bool,
    ) -> Sampling:
        """`episode_options` are `batch_mode`, `trajs_per_batch`, `traj_format` and
        `trajs_per_write`."""
        horizon = Horizon.validate(
            soft_horizon=soft_horizon,
            no_done_at_end=no_done_at_end,
            max_frames_per_traj=max_frames_per_traj,
            env=env,
        )
        if max_frames_per_traj is not None:
            env = StepLimit(env, max_frames_per_traj, soft=soft_horizon)
        if set_truncated:
            require_truncated_flag(env, "set_truncated=True")
        if no_done_at_end:
            require_truncated_flag(env, "no_done_at_end=True")
        episode_mode = EpisodeMode.validate(
            **episode_options, frames_per_batch=frames_per_batch, has_buffer=has_buffer
        )
        refuse_with_whole_episodes(
            episode_mode,
            return_same_td=return_same_td,
            reset_at_each_iter=reset_at_each_iter,
            set_truncated=set_truncated,
            split_trajs=split_trajs,
            soft_horizon=soft_horizon,
            no_done_at_end=no_done_at_end,
        )
        return cls(env, horizon, episode_mode)


@dataclass(frozen=True)
class BatchGeometry:
    """How many steps make a batch, and the frames it holds (a frame is an env step, or with
    `count_steps_by="agent_steps"` an agent's step)."""

    frames_per_step: int
    steps_per_batch: int
    frames_per_batch: int

    @classmethod
    def of(cls, env: Any, frames_per_batch: int, count_steps_by: str) -> BatchGeometry:
        """The geometry for `env`; `frames_per_batch` is rounded up to whole steps of the env
        batch, with a warning when it was not a multiple."""
        frames_per_step = frames_per_env_step(env, count_steps_by)
        batch_numel = max(1, math.prod(env.batch_size)) * frames_per_step
        steps = -(-frames_per_batch // batch_numel)
        if steps * batch_numel != frames_per_batch:
            agents = " (sub-envs x agents)" if frames_per_step > 1 else ""
            warnings.warn(
                f"frames_per_batch={frames_per_batch} is not a multiple of the env batch "
                f"{batch_numel}{agents}; collecting {steps * batch_numel} frames per batch.",
                stacklevel=3,
            )
        return cls(frames_per_step, steps, steps * batch_numel)


def refuse_interruptor_with_whole_episodes(interruptor: Any, sampling: Sampling) -> None:
    """An interruptor cuts batches short; batches of whole episodes have no fixed length to
    cut, and the frames past a cut (marked invalid) would enter the episodes."""
    if interruptor is not None and sampling.episode_mode is not None:
        raise ValueError(
            "interruptor cannot be used with trajs_per_batch or batch_mode="
            "'complete_episodes': a batch of whole episodes has no fixed length to cut short. "
            "Drop one of the two."
        )


def check_leaf_schemes(schemes: Mapping[str, Any] | None) -> None:
    """`weight_sync_schemes` given to a single-process `Collector` (TorchRL's examples pass
    one): checked as the collectors with children check theirs; the policy's is unused,
    since this collector loads weights in place (`ModelSenders` keeps the TorchRL schemes of
    other models). Returns None, what `BatchOptions` is then given.

    Raises:
        TypeError: a value that is no scheme (ours or TorchRL's).
    """
    check_schemes("weight_sync_schemes", schemes, other_models=True)

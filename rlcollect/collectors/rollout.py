"""THE rollout loop: one batch into one carrier, `policy_step(t); env_step(t)` for every step.

Every collector runs this loop, wherever it runs (this process, worker processes, Ray
actors). Each option a user passes was turned into a part at construction (a step limit in
the env, a device mover in the policy step, a sink after delivery), so the loop body has no
branch per option. What the two calls do:

* `policy_step(t)` (`policy/steps.py`) reads the root of step t from the carrier's views and
  writes the policy's outputs beside it (random actions during `init_random_frames`);
* `env_step(t)` (`carrier.py`, over the env's buffer face in `envs/base.py`) steps the env
  into the `"next"` entries of step t and moves them to the root of step t + 1, resetting the
  sub-envs that ended.

Around the loop, `begin` binds the carrier and starts from a reset or from the last batch's
end, and `end` accounts the batch (episode returns, flags, trajectory ids, policy version).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict.nn import InteractionType, set_interaction_type

from rlcollect.collectors.bookkeeping import EpisodeTracker, TrajectoryCounter
from rlcollect.collectors.carrier import CarrierLayout
from rlcollect.collectors.devices import DeviceSplit
from rlcollect.collectors.policy.holder import PolicyHolder


class BatchAbandonedError(Exception):
    """A batch given up half-way (its `stop` answered True, e.g. at shutdown)."""


class BatchCutShortError(Exception):
    """TorchRL's interruptor stopped the batch after `steps` steps: the batch keeps them."""

    def __init__(self, steps: int) -> None:
        super().__init__(steps)
        self.steps = steps


def interruptible(env_step: Callable[[int], None], interruptor: Any) -> Callable[[int], None]:
    """`env_step`, then TorchRL's interruptor polled (as TorchRL polls it, after every env
    step): once `collection_stopped()` answers True, the batch ends after this step."""
    stopped = interruptor.collection_stopped

    def step_then_poll(t: int) -> None:
        env_step(t)
        if stopped():
            raise BatchCutShortError(t + 1)

    return step_then_poll


@dataclass
class TrajectoryStream:
    """What outlives one batch and one carrier: the env's trajectories across batches.

    `needs_reset` asks the next batch to start from a reset (after a seed, a checkpoint load,
    an abandoned batch); `unstarted` holds until the first batch gives the first ids.
    """

    trajectories: TrajectoryCounter = field(default_factory=TrajectoryCounter)
    episodes: EpisodeTracker = field(default_factory=EpisodeTracker)
    needs_reset: bool = False
    # TorchRL's reset(index=...): the sub-envs (env-batch shaped mask) the next batch resets.
    reset_mask: torch.Tensor | None = None
    unstarted: bool = True
    on_reset: list[Callable[[], None]] = field(default_factory=list)


@dataclass(frozen=True)
class LoopFlags:
    """The options the loop's edges read: fixed at construction."""

    reset_at_each_iter: bool = False
    set_truncated: bool = False
    no_done_at_end: bool = False
    exploration_type: InteractionType | None = None
    inference_mode: bool = True
    # TorchRL's interruptor (`collection_stopped()`), polled after every env step when given.
    interruptor: Any = None


class RolloutLoop:
    """Collects one batch into `layout`'s carrier: `collect()` = begin, the steps, end.

    Args:
        env: the env, bound to the carrier at the start of every batch.
        layout: the carrier and its per-batch upkeep.
        policy: the policy on its device (`PolicyHolder`); None of its module means random
            actions.
        steps: steps per batch (T).
        stream: the trajectories this loop continues (shared with a loop on another carrier).
        flags: the options the loop's edges read.
    """

    def __init__(
        self,
        env: Any,
        layout: CarrierLayout,
        policy: PolicyHolder,
        steps: int,
        stream: TrajectoryStream,
        flags: LoopFlags,
    ) -> None:
        self.env, self.layout, self.policy = env, layout, policy
        self.steps, self.stream, self.flags = steps, stream, flags
        self.random_step = layout.random_step(env)
        self.policy_step = layout.policy_step(policy, flags.inference_mode) or self.random_step
        self.env_step = layout.env_step(env)
        if flags.interruptor is not None:
            self.env_step = interruptible(self.env_step, flags.interruptor)

    @classmethod
    def build(
        cls,
        env: Any,
        policy: PolicyHolder,
        steps: int,
        *,
        stream: TrajectoryStream | None = None,
        flags: LoopFlags | None = None,
        start_from: RolloutLoop | None = None,
    ) -> RolloutLoop:
        """The loop over a new carrier of `steps` steps for `env` (batch and storage on the
        env's device): the engine's smallest whole, for a door that runs the loop itself.

        With `start_from` (a loop over the same env), the new loop goes on from where that one
        stands, on its stream: same trajectories, no reset.
        """
        devices = DeviceSplit.resolve(env_own_device=env.device)
        layout = CarrierLayout.build(
            env,
            policy,
            steps,
            devices,
            track_version=False,
            start_from=None if start_from is None else start_from.layout,
        )
        if stream is None:
            stream = TrajectoryStream() if start_from is None else start_from.stream
        return cls(env, layout, policy, steps, stream, flags or LoopFlags())

    def on(self, layout: CarrierLayout) -> RolloutLoop:
        """The same loop over another carrier (e.g. a user's `RolloutBuffer` rollout)."""
        return RolloutLoop(self.env, layout, self.policy, self.steps, self.stream, self.flags)

    def collect(self, random_actions: bool, stop: Callable[[], bool] | None = None) -> None:
        """Fill the carrier with one batch.

        `stop` is polled before every step; when it answers True the batch is abandoned
        (`BatchAbandonedError`) and the next batch starts from a reset. An interruptor that
        stops collection cuts the batch short instead: the steps collected are kept, the
        others are marked invalid (trajectory id -1, as TorchRL marks them), and the next
        batch goes on from where this one stopped.
        """
        self.begin()
        policy_step = self.random_step if random_actions else self.policy_step
        env_step = self.env_step
        try:
            with torch.no_grad(), set_interaction_type(self.flags.exploration_type):
                for t in range(self.steps):
                    if stop is not None and stop():
                        raise BatchAbandonedError
                    policy_step(t)
                    env_step(t)
        except BatchCutShortError as cut:
            self.layout.stop_after(cut.steps)
            self.end(cut.steps)
            self.layout.mark_uncollected(cut.steps)
            return
        except BaseException:
            # The env has moved on but slot T was not written: carrying it over would start
            # the next batch with a transition that never happened. Reset instead.
            self.stream.needs_reset = True
            raise
        self.end()

    def policy_at(self, t: int) -> None:
        """Run the policy alone at slot `t` of the carrier, as the loop runs it (e.g. at slot
        `T`, for the bootstrap value of the last observation: its other outputs there are
        padding)."""
        with torch.no_grad(), set_interaction_type(self.flags.exploration_type):
            self.policy_step(t)

    def begin(self) -> None:
        """Bind the carrier; start from a reset, or carry the last batch's end over."""
        layout, stream = self.layout, self.stream
        self.env.bind(layout.carrier)
        if stream.needs_reset or self.flags.reset_at_each_iter:
            stream.reset_mask = None
            self.env.reset_into(0)
            layout.start_trajectories(stream.trajectories.take(layout.env_numel, layout.device))
            stream.episodes.restart()
            stream.needs_reset = False
            for cut_by_reset in stream.on_reset:
                cut_by_reset()
        else:
            layout.carry_over()
            if stream.unstarted:
                layout.start_trajectories(stream.trajectories.take(layout.env_numel, layout.device))
            if stream.reset_mask is not None:
                self._reset_some(stream.reset_mask)
        stream.unstarted = False

    def _reset_some(self, mask: torch.Tensor) -> None:
        """Reset the sub-envs of `mask` alone: new trajectories (ids, recurrent state, running
        returns) there, the others go on (TorchRL's `reset(index=...)`)."""
        stream, layout = self.stream, self.layout
        stream.reset_mask = None
        mask = mask.to(layout.device)
        self.env.reset_into(0, mask.reshape(-1))
        layout.restart_trajectories(mask, stream.trajectories.take(int(mask.sum()), layout.device))
        stream.episodes.restart_some(mask.reshape(-1))

    def end(self, steps: int | None = None) -> None:
        """Account the batch just collected (its first `steps` steps, all by default):
        episode returns, flags, trajectory ids."""
        layout = self.layout
        layout.record_episodes(self.stream.episodes)
        if self.flags.set_truncated:
            layout.truncate_last_step(self.steps if steps is None else steps)
        layout.finish_batch(self.stream.trajectories, self.policy.version)
        if self.flags.no_done_at_end:
            layout.clear_done_flags()

"""`CarrierLayout`: the collector's preallocated `[*B, T + 1]` buffer and its per-batch upkeep.

The carrier holds the env's root and `"next"` keys, the policy's outputs and the collector's
own keys. Slot `T` of the root holds the observation the next batch starts from, so a batch is
the view `carrier[..., :T]` and carrying over costs one copy per root key per batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.batch.flags import end_flag_keys, end_of_trajectory
from rlcollect.collectors.bookkeeping import EpisodeTracker, TrajectoryCounter
from rlcollect.collectors.devices import DeviceSplit
from rlcollect.collectors.policy.holder import PolicyHolder
from rlcollect.collectors.policy.recurrent_state import PolicyStateCarry
from rlcollect.collectors.policy.steps import RandomStep
from rlcollect.collectors.sampling.trajectory_views import TrajectoryViews
from rlcollect.envs.base import EnvBase
from rlcollect.envs.non_tensor import copy_non_tensor, non_tensor_keys, time_index

NestedKey = str | tuple[str, ...]
POLICY_VERSION_KEY = (keys.NEXT, keys.POLICY_VERSION)


def _env_frame(env: EnvBase, devices: DeviceSplit, track_version: bool) -> TensorDictBase:
    """One zero-filled frame of the env's keys and the collector's own."""
    # Blocking: TensorDict.to's default (non-blocking copies, then a sync for a CPU target)
    # would ask torch whether CUDA is available, a CUDA call in a collector that uses none.
    frame = env.fake_tensordict().to(devices.env, non_blocking=False)
    frame.set(keys.TRAJ_IDS, torch.zeros(env.batch_size, dtype=torch.int64, device=devices.env))
    if track_version:
        version = torch.zeros(env.batch_size, dtype=torch.int64, device=devices.env)
        frame.set(POLICY_VERSION_KEY, version)
    return frame


def _expand(frame: TensorDictBase, steps: int) -> TensorDictBase:
    """A zero-filled `[*B, steps + 1]` carrier of `frame`'s keys, last dim named "time"."""
    time_dim = frame.batch_dims
    carrier = frame.unsqueeze(time_dim).expand(*frame.batch_size, steps + 1).clone()
    carrier.zero_()
    carrier.refine_names(*([None] * time_dim), keys.TIME_DIM_NAME)
    return carrier


@dataclass
class CarrierLayout:
    """The carrier, its batch view, and the keys that carry from one batch to the next."""

    carrier: TensorDictBase
    steps: int
    output_keys: list[NestedKey]
    carry_keys: list[NestedKey]
    device: torch.device
    state_keys: list[tuple[str, ...]] = field(default_factory=list)
    done_keys: list[NestedKey] = field(default_factory=lambda: list(keys.DONE_KEYS))
    reward_keys: list[NestedKey] = field(default_factory=lambda: [keys.REWARD])
    # Whether a truncated flag alone ends a trajectory (a soft horizon: truncated, not done).
    cut_on_truncated: bool = False
    # The trajectory views the policy reads, written at every step (view_requirements).
    views: TrajectoryViews | None = None
    batch_view: TensorDictBase = field(init=False)

    def __post_init__(self) -> None:
        self.time_dim = self.carrier.batch_dims - 1
        self.env_numel = max(1, self.carrier.shape[: self.time_dim].numel())
        index = (*([slice(None)] * self.time_dim), slice(0, self.steps))
        self.batch_view = self.carrier[index]
        next_td = self.carrier.get(keys.NEXT)
        present = next_td.keys(include_nested=True)
        self._traj = self.carrier.get(keys.TRAJ_IDS)
        # One `done` flag per group of flags (one at the root for most envs), the truncated
        # flags with the done flag of their group, and every reward.
        self._ends = [next_td.get(key) for key in end_flag_keys(self.done_keys)]
        self._truncations = [
            (next_td.get(key), next_td.get(keys.sibling_key(key, keys.DONE)))
            for key in self.done_keys
            if keys.last_name(key) == keys.TRUNCATED and key in present
        ]
        self._rewards = [next_td.get(key) for key in self.reward_keys]
        self._terminations = [
            next_td.get(key)
            for key in self.done_keys
            if keys.last_name(key) == keys.TERMINATED and key in present
        ]
        # What ends a trajectory (new id, an episode counted): done, and a soft horizon's cut.
        self._cuts = list(self._ends)
        if self.cut_on_truncated:
            self._cuts += [truncated for truncated, _ in self._truncations]
        # Non-tensor entries (e.g. strings a TorchRL transform writes) are copied through the
        # carrier at an index; the batch view holds stale copies of them, refreshed per batch.
        self._extras = non_tensor_keys(self.carrier)
        extras = set(self._extras)
        carry = [keys.plain_key(key) for key in self.carry_keys]
        self._extra_carry = [key for key in carry if key in extras]
        self._tensor_carry = [key for key in carry if key not in extras]
        self._version = (
            self.carrier.get(POLICY_VERSION_KEY)
            if POLICY_VERSION_KEY in self.carrier.keys(include_nested=True)
            else None
        )
        self._state_carry = (
            PolicyStateCarry(self.carrier, self.state_keys, self.time_dim, self.ended_at)
            if self.state_keys
            else None
        )
        # Views restart wherever a trajectory ends, a soft horizon's cut included (RLlib
        # starts a new episode there); a recurrent state goes on through such a cut.
        self._view_writer = (
            None
            if self.views is None
            else self.views.writer(self.carrier, self.time_dim, self._cuts, self.cut_at)
        )

    @classmethod
    def build(
        cls,
        env: EnvBase,
        policy: Any,
        steps: int,
        devices: DeviceSplit,
        track_version: bool,
        cut_on_truncated: bool = False,
        views: TrajectoryViews | None = None,
        start_from: CarrierLayout | None = None,
    ) -> CarrierLayout:
        """Allocate the carrier, with the env reset into its slot T (where a batch starts
        from: the first batch carries it over as any later one does); with `start_from` (a
        layout over the same env, e.g. of another batch length), its slot T instead, so the
        env's trajectories go on in the new carrier without a reset.

        The policy's outputs are learnt from one call on that real first observation, not on
        zeros: a policy may reject an impossible input (e.g. an action mask of all zeros).
        The env is then bound to the full carrier, which holds the policy's outputs too.
        """
        frame = _env_frame(env, devices, track_version)
        if views is not None:
            views.add_columns(frame)
        if getattr(env, "keeps_no_device", False) and devices.env.type == "cpu":
            frame.clear_device_()  # a TorchRL env without a device gets TensorDicts without one
        time_dim = len(env.batch_size)
        carrier = _expand(frame, steps)
        env.bind(carrier)
        if start_from is None:
            env.reset_into(steps)
        else:
            start_from.hand_on(carrier, steps)
        if views is not None:  # what the policy reads at the first step
            views.start(carrier, time_dim, steps)
        slot = time_index(time_dim, steps)
        first = carrier[slot].exclude(keys.NEXT)
        outputs, output_keys, state_keys = policy.learn_outputs(env, first)
        if outputs is not None:
            frame.update(outputs.to(devices.env))
            for key in state_keys:  # the root slot the policy reads its state from
                if key not in frame.keys(include_nested=True):
                    frame.set(key, torch.zeros_like(frame.get((keys.NEXT, *key))))
            full = _expand(frame, steps)
            full[slot].update_(first.exclude(*output_keys))
            for extra in non_tensor_keys(first):  # an index of them is a copy, not a view
                full.set_at_(extra, first.get(extra), slot)
            carrier = full
            env.bind(carrier)
        carry_keys: list[NestedKey] = [*env.observation_keys, *env.done_keys, keys.TRAJ_IDS]
        carry_keys += state_keys
        if views is not None:
            carry_keys += views.carry_keys
        return cls(
            carrier,
            steps,
            output_keys,
            carry_keys,
            devices.env,
            state_keys,
            list(env.done_keys),
            list(env.reward_keys),
            cut_on_truncated,
            views,
        )

    def over(self, carrier: TensorDictBase) -> CarrierLayout:
        """This layout over another carrier of the same keys and shapes (e.g. one bound to a
        user's rollout storage, `collectors/single/storage_binding.py`), starting where this
        one stands: the root entries that carry over are copied from this layout's slot T.
        """
        layout = CarrierLayout(
            carrier,
            self.steps,
            self.output_keys,
            self.carry_keys,
            self.device,
            self.state_keys,
            self.done_keys,
            self.reward_keys,
            self.cut_on_truncated,
            self.views,
        )
        layout.carry_from(self)
        return layout

    def hand_on(self, carrier: TensorDictBase, steps: int) -> None:
        """Slot `steps` of `carrier` (a new carrier over the same env) = this carrier's slot
        T, for the root tensors that carry and that `carrier` holds."""
        present = set(carrier.keys(include_nested=True, leaves_only=True))
        for key in self._tensor_carry:
            if key in present:
                self._at(carrier.get(key), steps).copy_(self._at(self.carrier.get(key), self.steps))

    def carry_from(self, other: CarrierLayout) -> None:
        """Slot T of this carrier = slot T of `other`'s, for the root keys that carry (the
        state the next batch starts from)."""
        for key in self._tensor_carry:
            self._at(self.carrier.get(key), self.steps).copy_(
                other._at(other.carrier.get(key), other.steps)
            )
        for key in self._extra_carry:
            last = time_index(self.time_dim, self.steps)
            copy_non_tensor(other.carrier, self.carrier, key, last, last)

    def _at(self, tensor: torch.Tensor, t: int) -> torch.Tensor:
        return tensor.select(self.time_dim, t)

    def ended_at(self, t: int) -> torch.Tensor:
        """Which sub-envs ended a trajectory at step `t`, shaped as the env batch."""
        return end_of_trajectory([self._at(flag, t) for flag in self._ends], self.time_dim)

    def cut_at(self, t: int) -> torch.Tensor:
        """Which sub-envs ended a trajectory at step `t` (done, or a soft horizon's cut)."""
        return end_of_trajectory([self._at(flag, t) for flag in self._cuts], self.time_dim)

    def _ended_in_batch(self) -> torch.Tensor:
        """`[n, T]`: which steps of the batch just collected ended a trajectory."""
        flags = [flag.narrow(self.time_dim, 0, self.steps) for flag in self._cuts]
        ended = end_of_trajectory(flags, self.time_dim + 1)
        return ended.reshape(self.env_numel, self.steps)

    # --- per-step parts -------------------------------------------------------------------------

    def policy_step(
        self, policy: PolicyHolder, inference_mode: bool
    ) -> Callable[[int], None] | None:
        """The per-step policy callable on this carrier (None for random actions)."""
        return policy.step_on(
            self.carrier, self.time_dim, self.output_keys, self.device, inference_mode
        )

    def env_step(self, env: EnvBase) -> Callable[[int], None]:
        """The per-step env callable: step, advance, write the trajectory views (for the next
        step's policy) and carry the policy's recurrent state."""
        step_and_advance: Callable[[int], None] = env.step_and_advance_into
        if self._view_writer is not None:
            step_and_advance = self._view_writer.after(step_and_advance)
        carry = self._state_carry
        if carry is None:
            return step_and_advance

        def step_and_carry(t: int) -> None:
            step_and_advance(t)
            carry(t)

        return step_and_carry

    def random_step(self, env: EnvBase) -> RandomStep:
        """The per-step callable writing random actions from `env`'s action spec(s)."""
        return RandomStep(env, self.carrier, self.time_dim)

    # --- per-batch upkeep -----------------------------------------------------------------------

    def start_trajectories(self, ids: torch.Tensor, t: int = 0) -> None:
        """New trajectories start at slot `t` (0, or T before the first batch) with `ids`
        (one per sub-env), with a fresh recurrent state."""
        self._at(self._traj, t).copy_(ids.reshape(self._traj.shape[: self.time_dim]))
        if self._state_carry is not None:
            self._state_carry.clear(t)
        if self._view_writer is not None:
            self._view_writer.start(t)

    @property
    def restarts_some_sub_envs(self) -> bool:
        """Whether `restart_trajectories` can restart some sub-envs alone (not with trajectory
        views, whose windows restart for every sub-env at once)."""
        return self._view_writer is None

    def restart_trajectories(self, mask: torch.Tensor, ids: torch.Tensor) -> None:
        """The sub-envs in `mask` (env-batch shaped; just reset at slot 0) start new
        trajectories with `ids` (one per sub-env in `mask`), with a fresh recurrent state."""
        if not self.restarts_some_sub_envs:
            raise ValueError("trajectory views restart every sub-env at once.")
        first = self._at(self._traj, 0)
        first[mask.reshape(first.shape)] = ids
        if self._state_carry is not None:
            self._state_carry.clear(0, mask)

    def carry_over(self) -> None:
        """Slot 0 of the next batch = slot T of this one, for the root keys that carry."""
        for key in self._tensor_carry:
            tensor = self.carrier.get(key)
            self._at(tensor, 0).copy_(self._at(tensor, self.steps))
        for key in self._extra_carry:
            last, first = time_index(self.time_dim, self.steps), time_index(self.time_dim, 0)
            copy_non_tensor(self.carrier, self.carrier, key, last, first)

    def with_extras(self, batch: TensorDictBase) -> TensorDictBase:
        """`batch` (a copy of the batch view) with the batch's non-tensor entries."""
        steps = time_index(self.time_dim, slice(0, self.steps))
        for key in self._extras:
            batch.set(key, self.carrier.get(key)[steps])
        return batch

    def truncate_last_step(self, steps: int | None = None) -> None:
        """Mark the batch's last step (of its first `steps`) truncated and done
        (`set_truncated=True`).

        The collector checks at construction that the env has a truncated flag.
        """
        if not self._truncations:
            raise KeyError("the carrier has no ('next', 'truncated') entry to mark.")
        last = (self.steps if steps is None else steps) - 1
        for truncated, done in self._truncations:
            self._at(truncated, last).fill_(True)
            self._at(done, last).fill_(True)

    def stop_after(self, steps: int) -> None:
        """The batch was cut short after `steps` steps (TorchRL's interruptor): the next
        batch starts from slot `steps`, and the steps past it end nothing and earn nothing
        (they hold the last batch's data), so the per-batch upkeep counts only real steps."""
        if steps >= self.steps:
            return
        for key in self._tensor_carry:
            tensor = self.carrier.get(key)
            self._at(tensor, self.steps).copy_(self._at(tensor, steps))
        for key in self._extra_carry:
            last, cut = time_index(self.time_dim, self.steps), time_index(self.time_dim, steps)
            copy_non_tensor(self.carrier, self.carrier, key, cut, last)
        next_td = self.carrier.get(keys.NEXT)
        for key in [*self.done_keys, *self.reward_keys]:
            next_td.get(key).narrow(self.time_dim, steps, self.steps - steps).zero_()

    def mark_uncollected(self, steps: int) -> None:
        """Trajectory id -1 for the steps past `steps` (TorchRL's mark of invalid frames)."""
        self._traj.narrow(self.time_dim, steps, self.steps - steps).fill_(-1)

    def clear_done_flags(self) -> None:
        """`no_done_at_end`: in the batch just collected, every episode end keeps only its
        `truncated` mark; `done` and `terminated` stay False."""
        for truncated, done in self._truncations:
            steps = done.narrow(self.time_dim, 0, self.steps)
            truncated.narrow(self.time_dim, 0, self.steps).logical_or_(steps)
            steps.zero_()
        for terminated in self._terminations:
            terminated.narrow(self.time_dim, 0, self.steps).zero_()

    def record_episodes(self, episodes: EpisodeTracker) -> None:
        """Account the returns of the episodes the env finished in the batch just collected.

        Called before `truncate_last_step`, so that a batch cut is not counted as an episode.
        """
        n = self.env_numel
        reward = sum(
            tensor.narrow(self.time_dim, 0, self.steps).reshape(n, self.steps, -1).sum(-1)
            for tensor in self._rewards
        )
        episodes.update(reward, self._ended_in_batch())

    def finish_batch(self, trajectories: TrajectoryCounter, version: int) -> None:
        """Trajectory ids and policy version for the batch just collected."""
        traj = self._traj.reshape(self.env_numel, self.steps + 1)
        trajectories.fill(traj[:, 0].clone(), self._ended_in_batch(), traj)
        if self._version is not None:
            self._version[..., : self.steps].fill_(version)

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
from rlcollect.collectors.bookkeeping import EpisodeTracker, TrajectoryCounter
from rlcollect.collectors.devices import DeviceSplit
from rlcollect.collectors.policy import (
    DictStep,
    ModuleStep,
    RandomStep,
    is_fast_module,
    policy_grad_mode,
    policy_outputs,
)
from rlcollect.collectors.policy_state import PolicyStateCarry, policy_state_keys
from rlcollect.envs.base import EnvBase

NestedKey = str | tuple[str, ...]
POLICY_VERSION_KEY = (keys.NEXT, keys.POLICY_VERSION)


def _prototype(
    env: EnvBase, policy: Any, devices: DeviceSplit, track_version: bool
) -> tuple[TensorDictBase, list[NestedKey], list[tuple[str, ...]]]:
    """One zero-filled frame with every key the carrier holds, the policy's output keys and
    the recurrent state keys the collector carries for it."""
    frame = env.fake_tensordict().to(devices.env)
    output_keys: list[NestedKey] = [keys.ACTION]
    state_keys: list[tuple[str, ...]] = []
    if policy.module is not None:
        root = frame.exclude(keys.NEXT, keys.ACTION).to(devices.policy)
        outputs = policy_outputs(policy.module, root)
        output_keys = list(outputs.keys(include_nested=True, leaves_only=True))
        frame.update(outputs.to(devices.env))
        state_keys = policy_state_keys(output_keys, env.observation_keys)
        for key in state_keys:  # the root slot the policy reads its state from
            if key not in frame.keys(include_nested=True):
                frame.set(key, torch.zeros_like(frame.get((keys.NEXT, *key))))
    frame.set(keys.TRAJ_IDS, torch.zeros(env.batch_size, dtype=torch.int64, device=devices.env))
    if track_version:
        version = torch.zeros(env.batch_size, dtype=torch.int64, device=devices.env)
        frame.set(POLICY_VERSION_KEY, version)
    return frame, output_keys, state_keys


@dataclass
class CarrierLayout:
    """The carrier, its batch view, and the keys that carry from one batch to the next."""

    carrier: TensorDictBase
    steps: int
    output_keys: list[NestedKey]
    carry_keys: list[NestedKey]
    device: torch.device
    state_keys: list[tuple[str, ...]] = field(default_factory=list)
    batch_view: TensorDictBase = field(init=False)

    def __post_init__(self) -> None:
        self.time_dim = self.carrier.batch_dims - 1
        self.env_numel = max(1, self.carrier.shape[: self.time_dim].numel())
        index = (*([slice(None)] * self.time_dim), slice(0, self.steps))
        self.batch_view = self.carrier[index]
        next_td = self.carrier.get(keys.NEXT)
        self._traj = self.carrier.get(keys.TRAJ_IDS)
        self._done = next_td.get(keys.DONE)
        self._truncated = next_td.get(keys.TRUNCATED) if keys.TRUNCATED in next_td else None
        self._reward = next_td.get(keys.REWARD)
        self._version = (
            self.carrier.get(POLICY_VERSION_KEY)
            if POLICY_VERSION_KEY in self.carrier.keys(include_nested=True)
            else None
        )
        self._state_carry = (
            PolicyStateCarry(self.carrier, self.state_keys, self.time_dim)
            if self.state_keys
            else None
        )

    @classmethod
    def build(
        cls,
        env: EnvBase,
        policy: Any,
        steps: int,
        devices: DeviceSplit,
        track_version: bool,
    ) -> CarrierLayout:
        """Allocate the carrier from one prototype frame of `env` and `policy`."""
        frame, output_keys, state_keys = _prototype(env, policy, devices, track_version)
        time_dim = len(env.batch_size)
        carrier = frame.unsqueeze(time_dim).expand(*env.batch_size, steps + 1).clone()
        carrier.zero_()
        carrier.refine_names(*([None] * time_dim), keys.TIME_DIM_NAME)
        carry_keys: list[NestedKey] = [*env.observation_keys, *env.done_keys, keys.TRAJ_IDS]
        carry_keys += state_keys
        return cls(carrier, steps, output_keys, carry_keys, devices.env, state_keys)

    def adopt(self, storage: TensorDictBase) -> CarrierLayout:
        """A layout over `storage` (e.g. a RolloutBuffer's `[N, T + 1]` TensorDict).

        Keys the collector writes that `storage` lacks are added to it, zero-filled; the root
        entries that carry over are copied from this layout's slot T to the storage's slot T.
        """
        expected = self.carrier.batch_size
        if storage.batch_size != expected:
            raise ValueError(
                f"the rollout storage has batch {tuple(storage.batch_size)}; this collector "
                f"writes {tuple(expected)} ([*env batch, frames_per_batch / env batch + 1])."
            )
        carrier_keys = self.carrier.keys(include_nested=True, leaves_only=True)
        present = storage.keys(include_nested=True)
        for key in carrier_keys:  # check everything before changing anything
            if key in present:
                ours, theirs = self.carrier.get(key), storage.get(key)
                if not isinstance(theirs, torch.Tensor) or (ours.shape, ours.dtype) != (
                    theirs.shape,
                    theirs.dtype,
                ):
                    found = (
                        f"{tuple(theirs.shape)} {theirs.dtype}"
                        if isinstance(theirs, torch.Tensor)
                        else type(theirs).__name__
                    )
                    raise ValueError(
                        f"the rollout storage's {key!r} is {found}; this collector writes "
                        f"{tuple(ours.shape)} {ours.dtype} there. Allocate the storage from "
                        "a frame of this env and policy."
                    )
        for key in carrier_keys:
            if key not in present:
                storage.set(key, torch.zeros_like(self.carrier.get(key)))
        layout = CarrierLayout(
            storage, self.steps, self.output_keys, self.carry_keys, self.device, self.state_keys
        )
        layout.carry_from(self)
        return layout

    def carry_from(self, other: CarrierLayout) -> None:
        """Slot T of this carrier = slot T of `other`'s, for the root keys that carry (the
        state the next batch starts from)."""
        for key in self.carry_keys:
            self._at(self.carrier.get(key), self.steps).copy_(
                other._at(other.carrier.get(key), other.steps)
            )

    def _at(self, tensor: torch.Tensor, t: int) -> torch.Tensor:
        return tensor.select(self.time_dim, t)

    # --- per-step parts -------------------------------------------------------------------------

    def policy_step(self, policy: Any, inference_mode: bool) -> Any:
        """The per-step policy callable for this carrier (fast path when possible), calling
        the policy under `torch.inference_mode` when `inference_mode` allows it."""
        if policy.module is None:
            return None
        policy_device = policy.device if policy.device != self.device else None
        grad_mode = policy_grad_mode(inference_mode, policy.module)
        if is_fast_module(policy.module):
            return ModuleStep(policy.module, self.carrier, self.time_dim, policy_device, grad_mode)
        return DictStep(
            policy.module, self.carrier, self.time_dim, self.output_keys, policy_device, grad_mode
        )

    def env_step(self, env: EnvBase) -> Callable[[int], None]:
        """The per-step env callable: step, advance, and carry the policy's recurrent state."""
        step_and_advance = env.step_and_advance_into
        carry = self._state_carry
        if carry is None:
            return step_and_advance

        def step_and_carry(t: int) -> None:
            step_and_advance(t)
            carry(t)

        return step_and_carry

    def random_step(self, action_spec: Any) -> RandomStep:
        """The per-step callable writing random actions."""
        return RandomStep(action_spec, self.carrier, self.time_dim)

    # --- per-batch upkeep -----------------------------------------------------------------------

    def start_trajectories(self, ids: torch.Tensor) -> None:
        """New trajectories start at slot 0 with `ids` (one per sub-env), with a fresh
        recurrent state."""
        self._at(self._traj, 0).copy_(ids.reshape(self._traj.shape[: self.time_dim]))
        if self._state_carry is not None:
            self._state_carry.clear(0)

    def carry_over(self) -> None:
        """Slot 0 of the next batch = slot T of this one, for the root keys that carry."""
        for key in self.carry_keys:
            tensor = self.carrier.get(key)
            self._at(tensor, 0).copy_(self._at(tensor, self.steps))

    def truncate_last_step(self) -> None:
        """Mark the batch's last step truncated and done (`set_truncated=True`).

        The collector checks at construction that the env has a truncated flag.
        """
        if self._truncated is None:
            raise KeyError("the carrier has no ('next', 'truncated') entry to mark.")
        self._at(self._truncated, self.steps - 1).fill_(True)
        self._at(self._done, self.steps - 1).fill_(True)

    def record_episodes(self, episodes: EpisodeTracker) -> None:
        """Account the returns of the episodes the env finished in the batch just collected.

        Called before `truncate_last_step`, so that a batch cut is not counted as an episode.
        """
        n = self.env_numel
        done = self._done[..., : self.steps, :].reshape(n, self.steps)
        reward = self._reward[..., : self.steps, :].reshape(n, self.steps, -1).sum(-1)
        episodes.update(reward, done)

    def finish_batch(self, trajectories: TrajectoryCounter, version: int) -> None:
        """Trajectory ids and policy version for the batch just collected."""
        n = self.env_numel
        done = self._done[..., : self.steps, :].reshape(n, self.steps)
        traj = self._traj.reshape(n, self.steps + 1)
        trajectories.fill(traj[:, 0].clone(), done, traj)
        if self._version is not None:
            self._version[..., : self.steps].fill_(version)

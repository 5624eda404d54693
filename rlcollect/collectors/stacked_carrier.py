"""`StackedCarrierLayout`: the carrier of envs whose entries cannot share one buffer, one
TensorDict a step stacked lazily over time, and its per-batch upkeep.

Heterogeneous agents (a TorchRL env whose agents' observations or actions differ in shape,
lazily stacked over the agent dim) and dynamic specs (an entry whose shape changes from step
to step) have no dense `[*B, T + 1]` buffer. For them the collector holds `T + 1` TensorDicts
of one step each, built from the env's `fake_tensordict()`, and the carrier is their lazy
stack over the time dim: the same loop (`rollout.py`) drives it, each step's entries are set
by the env (`envs/step_stack.py`) and the policy, and a batch is the stack of the first `T`
steps (a dense TensorDict where every step has the same shapes, e.g. heterogeneous agents, as
TorchRL's collector yields; a `LazyStackedTensorDict` otherwise). Slot `T` holds where the
next batch starts from, as in the dense carrier (`carrier.py`), which every other env keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDictBase

from rlcollect import keys
from rlcollect.batch.flags import end_flag_keys, end_of_trajectory
from rlcollect.collectors.bookkeeping import EpisodeTracker, TrajectoryCounter
from rlcollect.collectors.devices import DeviceSplit
from rlcollect.collectors.policy.holder import PolicyHolder
from rlcollect.collectors.sampling.trajectory_views import TrajectoryViews
from rlcollect.envs.base import EnvBase

NestedKey = str | tuple[str, ...]
POLICY_VERSION_KEY = (keys.NEXT, keys.POLICY_VERSION)


def fits_one_buffer(env: EnvBase) -> bool:
    """Whether `env`'s entries have one shape over its sub-envs and steps (most envs: the
    dense carrier); False for heterogeneous or dynamic specs (`TorchRLEnv.fits_one_buffer`)."""
    return bool(getattr(env, "fits_one_buffer", True))


class StackedCarrierLayout:
    """The step stack, the keys that carry from one batch to the next, and the per-batch
    upkeep; the same methods as `CarrierLayout`, which the loop calls.

    Args:
        slots: `T + 1` TensorDicts of one step each (batch: the env's).
        output_keys: the policy's outputs (the env's action keys for random actions).
        carry_keys: the root entries slot T hands to slot 0 of the next batch.
        device: where the env's entries live.
        done_keys, reward_keys: the env's.
        cut_on_truncated: whether a truncated flag alone ends a trajectory (soft horizon).
    """

    def __init__(
        self,
        slots: list[TensorDictBase],
        output_keys: list[NestedKey],
        carry_keys: list[NestedKey],
        device: torch.device,
        done_keys: list[NestedKey],
        reward_keys: list[NestedKey],
        cut_on_truncated: bool = False,
    ) -> None:
        self.slots = slots
        self.steps = len(slots) - 1
        self.time_dim = slots[0].batch_dims
        self.env_batch = slots[0].batch_size
        self.env_numel = max(1, self.env_batch.numel())
        self.carrier = LazyStackedTensorDict(*slots, stack_dim=self.time_dim)
        self.output_keys, self.carry_keys, self.device = output_keys, carry_keys, device
        self.done_keys, self.reward_keys = done_keys, reward_keys
        self._ends = end_flag_keys(done_keys)
        self._truncations = [
            (key, keys.sibling_key(key, keys.DONE))
            for key in done_keys
            if keys.last_name(key) == keys.TRUNCATED
        ]
        self._terminations = [key for key in done_keys if keys.last_name(key) == keys.TERMINATED]
        self._cuts = list(self._ends)
        if cut_on_truncated:
            self._cuts += [truncated for truncated, _ in self._truncations]
        self._tracks_version = POLICY_VERSION_KEY in slots[0].keys(include_nested=True)

    @classmethod
    def build(
        cls,
        env: EnvBase,
        policy: PolicyHolder,
        steps: int,
        devices: DeviceSplit,
        track_version: bool,
        cut_on_truncated: bool = False,
        views: TrajectoryViews | None = None,
    ) -> StackedCarrierLayout:
        """Allocate the `steps + 1` step TensorDicts with the env reset into slot T (where a
        batch starts from), and learn the policy's outputs from that first observation.

        Raises:
            ValueError: trajectory views or a recurrent policy state were asked for (they
                need the dense carrier).
        """
        ragged = getattr(env, "ragged_keys", [])
        if views is not None:
            raise ValueError(
                f"view_requirements need one buffer for all steps; {type(env).__name__}'s "
                f"entries at {ragged} differ in shape between sub-envs or steps. Drop "
                "view_requirements for this env."
            )
        frame = env.fake_tensordict().to(devices.env)
        frame.set(keys.TRAJ_IDS, torch.zeros(env.batch_size, dtype=torch.int64, device=devices.env))
        if track_version:
            frame.set(POLICY_VERSION_KEY, torch.zeros_like(frame.get(keys.TRAJ_IDS)))
        if getattr(env, "keeps_no_device", False) and devices.env.type == "cpu":
            frame.clear_device_()
        slots = [frame.clone() for _ in range(steps + 1)]
        env.bind(LazyStackedTensorDict(*slots, stack_dim=len(env.batch_size)))
        env.reset_into(steps)
        outputs, output_keys, state_keys = policy.learn_outputs(
            env, slots[steps].exclude(keys.NEXT)
        )
        if state_keys:
            raise ValueError(
                f"the policy carries a recurrent state at {state_keys}, which needs one buffer "
                f"for all steps; {type(env).__name__}'s entries at {ragged} differ in shape "
                "between sub-envs or steps. Use a policy without a state for this env."
            )
        if outputs is not None:
            outputs = outputs.to(devices.env)
            for slot in slots:
                slot.update(outputs.clone())
        layout = cls(
            slots,
            output_keys,
            [*env.observation_keys, *env.done_keys, keys.TRAJ_IDS],
            devices.env,
            list(env.done_keys),
            list(env.reward_keys),
            cut_on_truncated,
        )
        env.bind(layout.carrier)
        return layout

    # --- per-step parts -------------------------------------------------------------------------

    def policy_step(
        self, policy: PolicyHolder, inference_mode: bool
    ) -> Callable[[int], None] | None:
        """The per-step policy call on this carrier's slots (None for random actions)."""
        return policy.step_on(
            self.carrier,
            self.time_dim,
            self.output_keys,
            self.device,
            inference_mode,
            slots=self.slots,
        )

    def env_step(self, env: EnvBase) -> Callable[[int], None]:
        """The per-step env call: step, then move to the next step's root (resetting the
        sub-envs that ended), through the env's buffer face over the step stack."""
        return env.step_and_advance_into

    def random_step(self, env: EnvBase) -> Callable[[int], None]:
        """The per-step call setting random actions from `env`'s action specs."""
        spec, slots, device = env.full_action_spec, self.slots, self.device

        def random_actions(t: int) -> None:
            slots[t].update(spec.rand().to(device))

        return random_actions

    # --- flags ----------------------------------------------------------------------------------

    def _next(self, t: int) -> TensorDictBase:
        return self.slots[t].get(keys.NEXT)

    def _any(self, flag_keys: Sequence[NestedKey], t: int) -> torch.Tensor:
        next_td = self._next(t)
        return end_of_trajectory([next_td.get(key) for key in flag_keys], self.time_dim)

    def ended_at(self, t: int) -> torch.Tensor:
        """Which sub-envs ended a trajectory at step `t`, shaped as the env batch."""
        return self._any(self._ends, t)

    def cut_at(self, t: int) -> torch.Tensor:
        """Which sub-envs ended a trajectory at step `t` (done, or a soft horizon's cut)."""
        return self._any(self._cuts, t)

    def _ended_in_batch(self) -> torch.Tensor:
        """`[n, T]`: which steps of the batch just collected ended a trajectory."""
        ended = [self.cut_at(t).reshape(self.env_numel) for t in range(self.steps)]
        return torch.stack(ended, dim=1)

    def _fill(self, t: int, flag_keys: Sequence[NestedKey], value: bool) -> None:
        next_td = self._next(t)
        for key in flag_keys:
            flag = next_td.get(key)
            next_td.set(key, torch.full_like(flag, value))

    # --- per-batch upkeep -----------------------------------------------------------------------

    @property
    def batch_view(self) -> TensorDictBase:
        """The batch just collected: the stack of its `T` steps, last dim named "time"
        (dense where the steps' shapes agree, lazily stacked otherwise)."""
        batch = LazyStackedTensorDict.maybe_dense_stack(self.slots[: self.steps], self.time_dim)
        batch.refine_names(*([None] * self.time_dim), keys.TIME_DIM_NAME)
        return batch

    def with_extras(self, batch: TensorDictBase) -> TensorDictBase:
        """`batch` as it is: non-tensor entries are entries of each step."""
        return batch

    def over(self, carrier: TensorDictBase) -> StackedCarrierLayout:
        """Refused: a rollout storage is one dense buffer."""
        raise ValueError(
            "collect() and collect_rollout() fill one dense [N, T + 1] rollout; this env's "
            "entries differ in shape between sub-envs or steps, so its batches are stacks of "
            "steps. Iterate over the collector (or call next()) instead."
        )

    def start_trajectories(self, ids: torch.Tensor, t: int = 0) -> None:
        """New trajectories start at slot `t` with `ids` (one per sub-env)."""
        self.slots[t].get(keys.TRAJ_IDS).copy_(ids.reshape(self.env_batch))

    restarts_some_sub_envs = True

    def restart_trajectories(self, mask: torch.Tensor, ids: torch.Tensor) -> None:
        """The sub-envs in `mask` (just reset at slot 0) start new trajectories with `ids`."""
        first = self.slots[0].get(keys.TRAJ_IDS)
        first[mask.reshape(first.shape)] = ids

    def _carry(self, source: int, target: int) -> None:
        self.slots[target].update(self.slots[source].select(*self.carry_keys).clone())

    def carry_over(self) -> None:
        """Slot 0 of the next batch = slot T of this one, for the root keys that carry."""
        self._carry(self.steps, 0)

    def truncate_last_step(self, steps: int | None = None) -> None:
        """Mark the batch's last step (of its first `steps`) truncated and done."""
        if not self._truncations:
            raise KeyError("the carrier has no ('next', 'truncated') entry to mark.")
        last = (self.steps if steps is None else steps) - 1
        self._fill(last, [key for pair in self._truncations for key in pair], True)

    def stop_after(self, steps: int) -> None:
        """The batch was cut short after `steps` steps (TorchRL's interruptor): the next
        batch starts from slot `steps`; the steps past it end nothing and earn nothing."""
        if steps >= self.steps:
            return
        self._carry(steps, self.steps)
        for t in range(steps, self.steps):
            self._fill(t, [*self.done_keys, *self.reward_keys], False)

    def mark_uncollected(self, steps: int) -> None:
        """Trajectory id -1 for the steps past `steps` (TorchRL's mark of invalid frames)."""
        for t in range(steps, self.steps):
            self.slots[t].get(keys.TRAJ_IDS).fill_(-1)

    def clear_done_flags(self) -> None:
        """`no_done_at_end`: episode ends keep only their `truncated` mark."""
        for t in range(self.steps):
            next_td = self._next(t)
            for truncated, done in self._truncations:
                next_td.set(truncated, next_td.get(truncated) | next_td.get(done))
            self._fill(t, [done for _, done in self._truncations], False)
            self._fill(t, self._terminations, False)

    def record_episodes(self, episodes: EpisodeTracker) -> None:
        """Account the returns of the episodes the env finished in the batch just collected."""
        n = self.env_numel
        rewards = [
            sum(self._next(t).get(key).reshape(n, -1).sum(-1) for key in self.reward_keys)
            for t in range(self.steps)
        ]
        episodes.update(torch.stack(rewards, dim=1), self._ended_in_batch())

    def finish_batch(self, trajectories: TrajectoryCounter, version: int) -> None:
        """Trajectory ids and policy version for the batch just collected."""
        n = self.env_numel
        ids = [slot.get(keys.TRAJ_IDS) for slot in self.slots]
        traj = torch.stack([tensor.reshape(n) for tensor in ids], dim=1)
        trajectories.fill(traj[:, 0].clone(), self._ended_in_batch(), traj)
        for t, tensor in enumerate(ids):
            tensor.copy_(traj[:, t].reshape(tensor.shape))
        if self._tracks_version:
            for slot in self.slots[: self.steps]:
                slot.get(POLICY_VERSION_KEY).fill_(version)


# Options that need every step in one buffer, and what to do instead.
_NEEDS_ONE_BUFFER = {
    "split_trajs": "split the batch's trajectories yourself (its ('collector', 'traj_ids'))",
    "compact_obs": "drop compact_obs",
    "store_obs_once": "drop store_obs_once",
    "max_frames_per_traj": "add TorchRL's StepCounter(max_steps=...) transform to the env",
    "batch_mode": "leave batch_mode='truncate_episodes'",
    "trajs_per_batch": "drop trajs_per_batch",
}


def refuse_options_needing_one_buffer(env: EnvBase, **options: Any) -> None:
    """Refuse, for an env whose entries do not fit one buffer, the options that re-shape or
    compact a batch as one buffer (each named with what to do instead).

    Raises:
        ValueError: naming the option, the env's ragged entries and the fix.
    """
    if fits_one_buffer(env):
        return
    for name, value in options.items():
        if value in (None, False, 0, -1, "truncate_episodes"):
            continue
        raise ValueError(
            f"{name}={value!r} needs one buffer for all steps, but {type(env).__name__}'s "
            f"entries at {getattr(env, 'ragged_keys', [])} differ in shape between sub-envs "
            "or steps (heterogeneous or dynamic specs), so its batches are stacks of steps. "
            f"Instead, {_NEEDS_ONE_BUFFER[name]}."
        )


def holds_stacked_steps(batch: TensorDictBase) -> bool:
    """Whether `batch` holds lazily stacked entries (a batch of a `StackedCarrierLayout`):
    its shapes may change from batch to batch, so no preallocated buffer can take it."""
    if isinstance(batch, LazyStackedTensorDict):
        return True
    children = batch.values()
    return any(
        isinstance(child, TensorDictBase) and holds_stacked_steps(child) for child in children
    )

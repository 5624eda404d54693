"""`RolloutStorage`: a user's `[*B, T + 1]` rollout that `Collector.collect` fills in place.

The rollout is bound once (`storage_binding.py`) and filled by the collector's own loop over
it (`RolloutLoop.on`), so a step costs what it costs in the collector's own carrier. After the
loop, once per rollout: the policy runs on the last observation (slot `T`) for its bootstrap
value, on the final observations of truncated episodes for `final_value` (buffer layout), and
the entries kept in scratch (another dtype or device) are copied into the rollout.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import set_interaction_type

from rlcollect import keys
from rlcollect.batch.compact import compact_keys
from rlcollect.batch.rollout_layout import FINAL_VALUE, is_buffer_layout, positive_size
from rlcollect.collectors.carrier import CarrierLayout
from rlcollect.collectors.rollout import RolloutLoop
from rlcollect.collectors.single.action_field import DiscreteAction
from rlcollect.collectors.single.storage_binding import (
    bind_buffer_storage,
    bind_torchrl_storage,
)


def check_num_steps(
    num_steps: object, rollout: object, steps_per_batch: int, frames_per_step: int
) -> None:
    """Refuse a `num_steps` that is not the rollout's `T` or the collector's steps per batch.

    Raises:
        TypeError: `rollout` is not a TensorDict with a time dim.
        ValueError: naming `num_steps`, the rollout's `T` and the collector's steps.
    """
    if not isinstance(rollout, TensorDictBase) or rollout.batch_dims == 0:
        raise TypeError(
            "rollout must be a TensorDict of batch [*env batch, T + 1] (e.g. "
            f"RolloutBuffer(...).start_rollout()), got {type(rollout).__name__}."
        )
    num_steps = positive_size("num_steps", num_steps)
    held = rollout.batch_size[-1] - 1
    if num_steps != held:
        raise ValueError(
            f"num_steps={num_steps} but the rollout holds T={held} steps (batch_size="
            f"{list(rollout.batch_size)} is [N, T + 1]); pass num_steps={held} or allocate "
            f"the rollout with rollout_len={num_steps}."
        )
    if num_steps != steps_per_batch:
        raise ValueError(
            f"num_steps={num_steps} but this collector runs {steps_per_batch} steps per batch; "
            f"build it with frames_per_batch={num_steps * frames_per_step} (num_steps times "
            f"the {frames_per_step} frames of one step of the env batch)."
        )


def discrete_action(env: Any) -> DiscreteAction | None:
    """The env's `"action"`, when it is discrete (one-hot or categorical)."""
    if keys.ACTION not in env.action_keys:
        return None
    return DiscreteAction.of(env.full_action_spec[keys.ACTION], len(env.batch_size))


class RolloutStorage:
    """A user's rollout bound to a collector: the loop over it and what follows the loop.

    Args:
        rollout: a `[*B, T + 1]` TensorDict in the TorchRL or the buffer layout.
        own: the collector's own carrier layout (the keys, shapes and dtypes it writes).
        loop: the collector's loop, run over the rollout by `self.loop`.

    Raises:
        TypeError, ValueError: from the binding, naming the entry that does not fit.
    """

    def __init__(self, rollout: TensorDictBase, own: CarrierLayout, loop: RolloutLoop) -> None:
        self.rollout = rollout
        self.is_buffer_layout = is_buffer_layout(rollout)
        if self.is_buffer_layout:
            self.binding = bind_buffer_storage(own.carrier, rollout, discrete_action(loop.env))
        else:
            self.binding = bind_torchrl_storage(own.carrier, rollout)
        self.layout = own.over(self.binding.carrier)
        self.loop = loop.on(self.layout)
        output_keys = [keys.plain_key(key) for key in own.output_keys]
        self.writes_value = keys.STATE_VALUE in output_keys

    def finish(self, *, bootstrap: bool) -> None:
        """After the loop: with `bootstrap` and a policy that writes `"state_value"`, the
        bootstrap value at slot `T` and the final values of truncated steps; then the scratch
        entries into the rollout."""
        if bootstrap and self.writes_value:
            self.loop.policy_at(self.layout.steps)
        if self.is_buffer_layout:
            self._write_final_values(bootstrap and self.writes_value)
        self.binding.write_back()

    def _write_final_values(self, evaluate: bool) -> None:
        """`final_value`: the value of the last observation of every episode truncated in the
        rollout, from one policy call on those observations; 0 at the other steps."""
        final = self.rollout.get(FINAL_VALUE, None)
        if final is None:
            return
        final.zero_()
        batch = self.layout.batch_view
        truncated = batch.get((keys.NEXT, keys.TRUNCATED), None)
        if not evaluate or truncated is None:
            return
        cut = truncated.reshape(batch.shape)
        terminated = batch.get((keys.NEXT, keys.TERMINATED), None)
        if terminated is not None:
            cut = cut & ~terminated.reshape(batch.shape)
        if not bool(cut.any()):
            return
        frames = batch[cut]
        request = frames.exclude(keys.NEXT, *self.layout.output_keys)
        for key in compact_keys(batch):  # the observations after the step
            request.set(key, frames.get((keys.NEXT, *key)))
        policy = self.loop.policy
        with torch.no_grad(), set_interaction_type(self.loop.flags.exploration_type):
            value = policy.module(request.to(policy.device)).get(keys.STATE_VALUE)
        steps = final.narrow(batch.batch_dims - 1, 0, self.layout.steps)
        steps[cut.to(final.device)] = value.reshape(-1).to(final)

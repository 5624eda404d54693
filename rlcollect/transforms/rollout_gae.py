"""`RolloutGAE`: generalized advantage estimation over a rollout in the buffer layout.

The rollout is a RolloutBuffer's `[*B, T + 1]` TensorDict of fields (`obs`, `value`,
`reward`, `done`, `terminated`, `final_value`, ...; `rlcollect/batch/rollout_layout.py`),
whose `value[..., T]` is the bootstrap value of the last observation. The estimates are those
of `GAE` (`gae.py`) and TorchRL's GAE on the same transitions, truncation included.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from rlcollect.batch.rollout_layout import (
    ADVANTAGE,
    DONE,
    RETURN,
    REWARD,
    TERMINATED,
    VALUE,
    is_buffer_layout,
    next_values,
)
from rlcollect.transforms.gae import _checked_fraction, _reverse_scan


def _field(rollout: TensorDictBase, name: str) -> torch.Tensor:
    """`rollout[name]` over the first `T` steps, or a KeyError naming the missing field."""
    entry = rollout.get(name, None)
    if entry is None:
        raise KeyError(
            f"RolloutGAE reads the rollout's {name!r}, which it lacks (it has "
            f"{sorted(map(str, rollout.keys()))}); fill it with collector.collect(...)."
        )
    return entry.narrow(rollout.batch_dims - 1, 0, rollout.batch_size[-1] - 1)


def _written(rollout: TensorDictBase, name: str, steps: torch.Tensor) -> None:
    """Write `steps` (`[*B, T]`) into the `[*B, T + 1]` field `name`, slot `T` zero; the
    field's tensor is reused when it has the shape, so views of it stay valid."""
    entry = rollout.get(name, None)
    full = (*steps.shape[:-1], steps.shape[-1] + 1)
    if not isinstance(entry, torch.Tensor) or entry.shape != full or entry.dtype != steps.dtype:
        entry = torch.zeros(full, dtype=steps.dtype, device=steps.device)
        rollout.set(name, entry)
    entry.narrow(-1, 0, steps.shape[-1]).copy_(steps)
    entry.narrow(-1, steps.shape[-1], 1).zero_()


class RolloutGAE:
    """Writes GAE's `advantage` and `return` into a buffer-layout rollout, in place.

    With `V = value`, step `t < T`, and the value after the step `V'_t = value[t + 1]`, or
    `final_value[t]` at the last step of an episode (the value of its last observation where it
    was truncated; it is not used where terminated):

        delta_t = reward_t + gamma * V'_t * (1 - terminated_t) - V_t
        A_t = delta_t + gamma * lmbda * (1 - done_t) * A_{t+1},  A_T = 0
        return_t = A_t + V_t

    So the last step bootstraps from `value[..., T]`, a truncated step from the value of its
    last observation, a terminated one from nothing: TorchRL's GAE on the same transitions
    (`as_torchrl(rollout)`). `advantage` and `return` are `[*B, T + 1]` fields (slot `T` is 0).

    Args:
        gamma: discount factor, in [0, 1].
        lmbda: GAE's lambda, in [0, 1].

    Raises:
        TypeError, ValueError: `gamma` or `lmbda` is not a number in [0, 1].

    Examples:
        >>> from rlcollect.replay import RolloutBuffer
        >>> rollout = RolloutBuffer(2, 3, 4, 1).start_rollout()
        >>> rollout["reward"][:, :3] = 1.0
        >>> rollout = RolloutGAE(gamma=0.5, lmbda=1.0)(rollout)
        >>> rollout["advantage"][0].tolist()  # 1 + 0.5 + 0.25, 1 + 0.5, 1; slot T is padding
        [1.75, 1.5, 1.0, 0.0]
    """

    def __init__(self, gamma: float, lmbda: float) -> None:
        self.gamma = _checked_fraction("gamma", gamma)
        self.lmbda = _checked_fraction("lmbda", lmbda)

    @torch.no_grad()
    def __call__(self, rollout: TensorDictBase) -> TensorDictBase:
        """Write `advantage` and `return` into `rollout` and return it.

        Raises:
            TypeError: `rollout` is not in the buffer layout.
            KeyError: a field GAE reads is missing, naming it.
        """
        if not is_buffer_layout(rollout):
            raise TypeError(
                "RolloutGAE takes a rollout in the buffer layout (fields obs, value, reward, "
                "done, ...: RolloutBuffer(num_envs, rollout_len, obs_dim, action_dim)); for "
                "TorchRL's keys use rlcollect.transforms.GAE."
            )
        value = _field(rollout, VALUE)
        reward = _field(rollout, REWARD)
        done, terminated = _field(rollout, DONE), _field(rollout, TERMINATED)
        next_value = next_values(rollout)
        delta = reward + self.gamma * (~terminated).to(value.dtype) * next_value - value
        discount = (self.gamma * self.lmbda) * (~done).to(value.dtype)
        advantage = _reverse_scan(delta, discount, time_dim=rollout.batch_dims - 1)
        _written(rollout, ADVANTAGE, advantage)
        _written(rollout, RETURN, advantage + value)
        return rollout

    def __repr__(self) -> str:
        return f"{type(self).__name__}(gamma={self.gamma}, lmbda={self.lmbda})"

"""N-step returns as a batch post-processor: `MultiStep`."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from rlcollect.keys import DONE, DONE_KEYS, MASK, NEXT, REWARD

ORIGINAL_REWARD = "original_reward"
STEPS_TO_NEXT_OBS = "steps_to_next_obs"
GAMMA = "gamma"
NONTERMINAL = "nonterminal"


def _steps_to_segment_end(done: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """For each step, how many steps remain in its segment, itself included ([*B, T] int64).

    A segment ends at a done step, at the last step of the batch, and, in a split batch, at the
    last real step before padding.
    """
    time_steps = done.shape[-1]
    is_end = done.clone()
    is_end[..., -1] = True
    if mask is not None:
        is_end[..., :-1] |= ~mask[..., 1:]
    time = torch.arange(time_steps, device=done.device).expand_as(done)
    end_time = torch.where(is_end, time, time_steps)
    next_end = end_time.flip(-1).cummin(-1).values.flip(-1)
    return next_end - time + 1


def _discounted_window_sum(
    reward: torch.Tensor, steps: torch.Tensor, n_steps: int, gamma: float
) -> torch.Tensor:
    """sum_{i < steps_t} gamma**i * r_{t+i}, for reward [*B, T, *F] and steps [*B, T]."""
    time_dim = steps.ndim - 1
    padded = torch.nn.functional.pad(reward.movedim(time_dim, -1), [0, n_steps - 1])
    windows = padded.unfold(-1, n_steps, 1).movedim(-2, time_dim)  # [*B, T, *F, n]
    offsets = torch.arange(n_steps, device=reward.device)
    weights = gamma ** offsets.to(reward.dtype) * (offsets < steps.unsqueeze(-1))  # [*B, T, n]
    feature_dims = reward.ndim - steps.ndim
    weights = weights.reshape(*steps.shape, *[1] * feature_dims, n_steps)
    return (windows * weights).sum(-1)


class MultiStep:
    """A post-processor that turns one-step transitions into n-step transitions.

    For each step t, the window of the next `n_steps` steps is cut at the end of the step's
    segment (a done step, the end of the batch, or the last real step of a split batch). With k_t
    the window's length, `MultiStep` writes, as TorchRL's `MultiStep` does:

    - `("next", "reward")`: sum_{i < k_t} gamma**i * r_{t+i}; the one-step reward moves to
      `("next", "original_reward")`;
    - every other `"next"` entry except the done flags (`"done"`, `"terminated"`,
      `"truncated"`), e.g. `("next", "observation")`, taken from step t + k_t - 1;
    - `"steps_to_next_obs"` = k_t (int64), `"gamma"` = gamma**k_t (float32), and
      `"nonterminal"` = k_t > 1 (bool), each of shape `[*env_batch, T]`.

    The done flags of step t are kept as they are (as TorchRL keeps them). A loss discounts the
    bootstrap value by `"gamma"` (or gamma ** `"steps_to_next_obs"`, as TorchRL's losses do).
    Departure from TorchRL: in a split batch (with `("collector", "mask")`) a window never runs
    into the padding, where TorchRL's would take the next observation from the zero padding.

    Contract: `__call__(batch)` takes a batch `[*env_batch, T]` (time last) with
    `("next", "reward")` and `("next", "done")` of shape `[*env_batch, T]` or `[*env_batch, T, 1]`,
    and returns a shallow copy with the entries above replaced or added; the input is not
    modified.

    Args:
        gamma: discount factor, in [0, 1].
        n_steps: the most steps a window spans, at least 1 (1 leaves rewards and observations
            unchanged).

    Raises:
        TypeError: if an argument has the wrong type.
        ValueError: if gamma is outside [0, 1] or n_steps < 1.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> done = torch.tensor([0, 0, 1, 0, 0, 0], dtype=torch.bool).unsqueeze(-1)
        >>> batch = TensorDict(
        ...     {
        ...         ("next", "observation"): torch.arange(1.0, 7.0).unsqueeze(-1),
        ...         ("next", "reward"): torch.ones(6, 1),
        ...         ("next", "done"): done,
        ...     },
        ...     batch_size=[6],
        ... )
        >>> out = MultiStep(gamma=0.5, n_steps=2)(batch)
        >>> out["next", "reward"].squeeze(-1)
        tensor([1.5000, 1.5000, 1.0000, 1.5000, 1.5000, 1.0000])
        >>> out["next", "observation"].squeeze(-1)
        tensor([2., 3., 3., 5., 6., 6.])
        >>> out["steps_to_next_obs"]
        tensor([2, 2, 1, 2, 2, 1])
    """

    def __init__(self, gamma: float, n_steps: int) -> None:
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)):
            raise TypeError(f"gamma must be a number in [0, 1], got {gamma!r}.")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(
                f"gamma must be in [0, 1], got gamma={gamma}; typical values are 0.9 to 0.999."
            )
        if isinstance(n_steps, bool) or not isinstance(n_steps, int):
            raise TypeError(f"n_steps must be an int >= 1, got {n_steps!r}.")
        if n_steps < 1:
            raise ValueError(
                f"n_steps must be >= 1, got n_steps={n_steps}; use 1 for one-step returns."
            )
        self.gamma = float(gamma)
        self.n_steps = n_steps

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        """Return a shallow copy of `batch` with n-step rewards and next entries."""
        done = self._per_step(batch, batch.get((NEXT, DONE)), (NEXT, DONE))
        mask = batch.get(MASK, None)
        if mask is not None:
            mask = self._per_step(batch, mask, MASK)
        steps = _steps_to_segment_end(done, mask).clamp_max(self.n_steps)
        reward = batch.get((NEXT, REWARD))
        out = batch.copy()
        out.set((NEXT, ORIGINAL_REWARD), reward)
        out.set((NEXT, REWARD), _discounted_window_sum(reward, steps, self.n_steps, self.gamma))
        out.get(NEXT).update(self._shifted_next(batch, steps))
        out.set(STEPS_TO_NEXT_OBS, steps)
        out.set(GAMMA, self.gamma ** steps.to(torch.float32))
        nonterminal = steps > 1
        if mask is not None:
            nonterminal &= mask
        out.set(NONTERMINAL, nonterminal)
        return out

    @staticmethod
    def _per_step(batch: TensorDictBase, flags: torch.Tensor, key: object) -> torch.Tensor:
        if flags.shape == batch.shape:
            return flags
        if flags.shape == (*batch.shape, 1):
            return flags.squeeze(-1)
        raise ValueError(
            f"MultiStep needs one {key!r} flag per step, shape {list(batch.shape)} or "
            f"{[*batch.shape, 1]}, got {list(flags.shape)}."
        )

    @staticmethod
    def _shifted_next(batch: TensorDictBase, steps: torch.Tensor) -> TensorDictBase:
        """The "next" entries (rewards and done flags aside) of step t + steps_t - 1."""
        time_steps = batch.shape[-1]
        rows = steps.reshape(-1, time_steps)
        source = torch.arange(rows.numel(), device=steps.device).view_as(rows) + rows - 1
        source = source.reshape(-1)
        moved = batch.get(NEXT).exclude(REWARD, *DONE_KEYS).reshape(-1)
        return moved.apply(lambda value: value[source], batch_size=[source.numel()]).reshape(
            batch.shape
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(gamma={self.gamma}, n_steps={self.n_steps})"

"""Recurrent policy state: a policy's `("next", key)` outputs carried to the root of the next step.

A recurrent policy (e.g. TorchRL's `LSTMModule`) reads its state from the root (`"recurrent_state"`)
and writes the new one to `("next", "recurrent_state")`; the next step must see it at the root.
When the env declares the key (TorchRL's `TensorDictPrimer` does), the env carries it like any
observation. Otherwise the collector does, here: after each step, root `t + 1` gets the state of
`("next", key)` at `t`, zeroed for the sub-envs that were reset (as a primer's reset would).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from tensordict import TensorDictBase

from rlcollect import keys

NestedKey = str | tuple[str, ...]


def as_tuple(key: NestedKey) -> tuple[str, ...]:
    return key if isinstance(key, tuple) else (key,)


def policy_state_keys(
    output_keys: Sequence[NestedKey],
    env_observation_keys: Sequence[NestedKey],
    step_only_keys: Sequence[NestedKey] = (),
) -> list[tuple[str, ...]]:
    """The root keys whose value the policy writes under `"next"` and the env does not carry:
    neither an observation of the env nor one of `step_only_keys` (its rewards and done
    flags, which stay under `"next"`)."""
    env_keys = {as_tuple(key) for key in [*env_observation_keys, *step_only_keys]}
    state = []
    for key in map(as_tuple, output_keys):
        if len(key) > 1 and key[0] == keys.NEXT and key[1:] not in env_keys:
            state.append(key[1:])
    return state


class PolicyStateCarry:
    """Copies `("next", key)` at `t` to `key` at `t + 1`, zeroed where the step at `t` was done."""

    def __init__(
        self,
        carrier: TensorDictBase,
        state_keys: Sequence[tuple[str, ...]],
        time_dim: int,
        ended_at: Callable[[int], torch.Tensor],
    ) -> None:
        next_td = carrier.get(keys.NEXT)
        self._pairs = [(carrier.get(key), next_td.get(key)) for key in state_keys]
        self._ended_at = ended_at
        self._time_dim = time_dim

    def _reset_mask(self, ended: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ended.reshape(*ended.shape, *([1] * (target.ndim - ended.ndim)))

    def __call__(self, t: int) -> None:
        ended = self._ended_at(t)  # [*B]
        for root, next_value in self._pairs:
            target = root.select(self._time_dim, t + 1)
            target.copy_(next_value.select(self._time_dim, t))
            target.masked_fill_(self._reset_mask(ended, target), 0)

    def clear(self, t: int, mask: torch.Tensor | None = None) -> None:
        """Zero the state at root `t` of the sub-envs in `mask` (env-batch shaped), just
        reset; of every sub-env without one."""
        for root, _ in self._pairs:
            state = root.select(self._time_dim, t)
            if mask is None:
                state.zero_()
            else:
                state[mask] = 0

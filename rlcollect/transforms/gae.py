"""Generalized advantage estimation as a batch post-processor: `GAE`."""

from __future__ import annotations

import torch
from tensordict import NestedKey, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn

from rlcollect.keys import (
    ADVANTAGE,
    DONE,
    MASK,
    NEXT,
    OBSERVATION,
    REWARD,
    STATE_VALUE,
    TERMINATED,
    VALUE_TARGET,
)


def _checked_fraction(name: str, value: object) -> float:
    """Return `value` as a float in [0, 1], or raise saying what was expected."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{name} must be a number in [0, 1], got {value!r} of type {type(value).__name__}."
        )
    if not 0.0 <= value <= 1.0:
        raise ValueError(
            f"{name} must be in [0, 1], got {name}={value}; typical values are 0.9 to 0.999."
        )
    return float(value)


def _value_key_of(module: TensorDictModuleBase) -> NestedKey:
    """The key the value network writes: its only out key, or "state_value" among several."""
    out_keys = list(module.out_keys)
    if STATE_VALUE in out_keys:
        return STATE_VALUE
    if len(out_keys) == 1:
        return out_keys[0]
    raise TypeError(
        f"value_network must write one value entry, got out_keys={out_keys}; give it a single "
        f'out key, or name the value "{STATE_VALUE}".'
    )


def _reverse_scan(delta: torch.Tensor, discount: torch.Tensor, time_dim: int) -> torch.Tensor:
    """A_t = delta_t + discount_t * A_{t+1}, with A_T = 0, vectorised over everything but time."""
    delta_by_time = delta.movedim(time_dim, 0).contiguous()
    discount_by_time = discount.expand_as(delta).movedim(time_dim, 0).contiguous()
    advantage = torch.empty_like(delta_by_time)
    advantage[-1] = delta_by_time[-1]
    for t in range(delta_by_time.shape[0] - 2, -1, -1):
        torch.addcmul(delta_by_time[t], discount_by_time[t], advantage[t + 1], out=advantage[t])
    return advantage.movedim(0, time_dim).contiguous()


class GAE:
    """A post-processor that adds generalized advantage estimates (Schulman et al., 2016).

    With V the value network, r the reward, and the flags of step t,

        delta_t = r_t + gamma * V(next_obs_t) * (1 - terminated_t) - V(obs_t)
        A_t = delta_t + gamma * lmbda * (1 - done_t) * A_{t+1}
        value_target_t = A_t + V(obs_t)

    as TorchRL's `GAE` computes them: a truncated step bootstraps from the value of its final
    observation, a terminated one does not, and the last step of the batch, done or not,
    bootstraps from its next observation (trajectories may continue in the next batch). When the
    batch carries a `("collector", "mask")` (a split batch), the recursion also stops before a
    padded step; entries at padded steps themselves are meaningless.

    Contract: `__call__(batch)` takes a batch `[*env_batch, T]` (time last) with the value
    network's inputs at the root and under `"next"`, `("next", "reward")`, `("next", "done")` and,
    optionally, `("next", "terminated")` (defaults to done). It returns a shallow copy of the batch
    with `"advantage"` and `"value_target"` (shaped like the reward) and the value under the
    network's out key and under `("next", <out key>)`. The input batch is not modified. Values are
    computed without gradient, in one call of the network on the observations and next
    observations together.

    Args:
        gamma: discount factor, in [0, 1].
        lmbda: GAE's lambda, in [0, 1].
        value_network: a `TensorDictModule` (its out key names the value, usually
            `"state_value"`) or a plain `nn.Module` mapping an `"observation"` tensor
            `[N, *obs_shape]` to values `[N, 1]`, written under `"state_value"`; or None
            when the batch already carries `"state_value"` and `("next", "state_value")`.

    Keyword Args:
        average_gae: standardize the advantage over the batch (mean 0, std 1; over real steps
            only in a split batch). The value target is computed before standardizing.

    Raises:
        TypeError: if an argument has the wrong type.
        ValueError: if gamma or lmbda is outside [0, 1].

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> value_net = TensorDictModule(
        ...     torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["state_value"]
        ... )
        >>> batch = TensorDict(
        ...     {
        ...         "observation": torch.randn(4, 10, 3),
        ...         ("next", "observation"): torch.randn(4, 10, 3),
        ...         ("next", "reward"): torch.randn(4, 10, 1),
        ...         ("next", "done"): torch.zeros(4, 10, 1, dtype=torch.bool),
        ...         ("next", "terminated"): torch.zeros(4, 10, 1, dtype=torch.bool),
        ...     },
        ...     batch_size=[4, 10],
        ... )
        >>> out = GAE(gamma=0.99, lmbda=0.95, value_network=value_net)(batch)
        >>> out["advantage"].shape, out["value_target"].shape, out["next", "state_value"].shape
        (torch.Size([4, 10, 1]), torch.Size([4, 10, 1]), torch.Size([4, 10, 1]))
    """

    def __init__(
        self,
        gamma: float,
        lmbda: float,
        value_network: nn.Module | None,
        *,
        average_gae: bool = False,
    ) -> None:
        self.gamma = _checked_fraction("gamma", gamma)
        self.lmbda = _checked_fraction("lmbda", lmbda)
        self.average_gae = bool(average_gae)
        self.value_network = value_network
        self.is_tensordict_module = False
        self.in_keys: list[NestedKey] = []
        self.value_key: NestedKey = STATE_VALUE
        if value_network is None:
            return  # the batch brings its values, as TorchRL's GAE(value_network=None) takes
        if not isinstance(value_network, nn.Module):
            raise TypeError(
                f"value_network must be a TensorDictModule or an nn.Module, got "
                f"{type(value_network).__name__}; wrap a function in an nn.Module."
            )
        self.is_tensordict_module = isinstance(value_network, TensorDictModuleBase)
        if self.is_tensordict_module:
            self.in_keys = list(value_network.in_keys)  # type: ignore[arg-type]
            self.value_key = _value_key_of(value_network)
        else:
            self.in_keys = [OBSERVATION]

    @torch.no_grad()
    def values(self, batch: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        """Return V(obs) and V(next_obs), each `[*batch, *value_shape]`, from one network call
        (or, without a network, the batch's own `"state_value"` and `("next", "state_value")`).
        """
        if self.value_network is None:
            return self._values_in(batch)
        size = batch.numel()
        if self.is_tensordict_module:
            inputs = torch.cat(
                [
                    batch.select(*self.in_keys).reshape(-1),
                    batch.get(NEXT).select(*self.in_keys).reshape(-1),
                ]
            )
            value = self.value_network(inputs).get(self.value_key)
        else:
            observation = batch.get(OBSERVATION)
            next_observation = batch.get((NEXT, OBSERVATION))
            feature_shape = observation.shape[batch.ndim :]
            value = self.value_network(
                torch.cat(
                    [
                        observation.reshape(size, *feature_shape),
                        next_observation.reshape(size, *feature_shape),
                    ]
                )
            )
            if value.ndim == 1:
                value = value.unsqueeze(-1)
        value = value.reshape(2, *batch.shape, *value.shape[1:])
        return value[0], value[1]

    def _values_in(self, batch: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        missing = [
            key for key in (STATE_VALUE, (NEXT, STATE_VALUE)) if batch.get(key, None) is None
        ]
        if missing:
            raise KeyError(
                f"GAE(value_network=None) reads the values from the batch, which lacks "
                f"{missing}; add them (e.g. with your value network) or pass value_network."
            )
        return batch.get(STATE_VALUE), batch.get((NEXT, STATE_VALUE))

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        """Return a shallow copy of `batch` with advantage, value target and values added."""
        if batch.ndim == 0:
            raise ValueError(
                "GAE expects a batch of shape [*env_batch, T] with time last, got batch_size=[]; "
                "unsqueeze a single step to [1]."
            )
        value, next_value = self.values(batch)
        reward = batch.get((NEXT, REWARD))
        if value.shape != reward.shape:
            raise ValueError(
                f"the value network must give one value per reward, shape {list(reward.shape)}, "
                f"got {list(value.shape)}; make its output [..., 1] for a [..., 1] reward."
            )
        advantage = self.advantage(batch, value, next_value)
        out = batch.copy()
        out.set(self.value_key, value)
        out.set((NEXT, self.value_key), next_value)
        out.set(VALUE_TARGET, advantage + value)
        if self.average_gae:
            advantage = self._standardized(advantage, batch.get(MASK, None))
        out.set(ADVANTAGE, advantage)
        return out

    def advantage(
        self, batch: TensorDictBase, value: torch.Tensor, next_value: torch.Tensor
    ) -> torch.Tensor:
        """Return the (unstandardized) advantage of `batch` given its values and next values."""
        reward = batch.get((NEXT, REWARD))
        done = batch.get((NEXT, DONE))
        terminated = batch.get((NEXT, TERMINATED), done)
        delta = reward + self.gamma * (~terminated).to(value.dtype) * next_value - value
        discount = (self.gamma * self.lmbda) * (~done).to(value.dtype)
        mask = batch.get(MASK, None)
        if mask is not None:
            next_is_real = torch.ones_like(mask)
            next_is_real[..., :-1] = mask[..., 1:]
            discount = discount * next_is_real.reshape(
                *mask.shape, *[1] * (discount.ndim - mask.ndim)
            )
        return _reverse_scan(delta, discount, time_dim=batch.ndim - 1)

    @staticmethod
    def _standardized(advantage: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        real = advantage if mask is None else advantage[mask]
        return (advantage - real.mean()) / real.std().clamp_min(1e-4)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(gamma={self.gamma}, lmbda={self.lmbda}, "
            f"value_key={self.value_key!r}, average_gae={self.average_gae})"
        )

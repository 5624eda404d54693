"""Generalized advantage estimation as a batch post-processor: `GAE`, single- or multi-agent."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import NestedKey, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn

from rlcollect.keys import MASK, NEXT, STATE_VALUE
from rlcollect.transforms.gae_keys import GAEKeys, replaced_keys, under_next


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
        f'out key, or name the value "{STATE_VALUE}" (or pick one with set_keys(value=...)).'
    )


def _aligned_flags(flags: torch.Tensor, reward: torch.Tensor, batch_dims: int) -> torch.Tensor:
    """`flags` viewed to broadcast over `reward`: env-level flags `[*batch, 1]` get a unit dim
    for each agent dim of a grouped reward `[*batch, n_agents, 1]`; per-agent flags stay."""
    extra = reward.ndim - flags.ndim
    if extra > 0:
        flags = flags.reshape(*flags.shape[:batch_dims], *[1] * extra, *flags.shape[batch_dims:])
    return flags


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

    Grouped (multi-agent) batches: point the keys at the group with `set_keys`, as with TorchRL's
    GAE. Values, advantages and value targets are then per agent (`[*B, T, n_agents, 1]`, like
    the group's reward); done and terminated flags are either per agent (`(group, "done")`) or
    env-level (`"done"`, `[*B, T, 1]`, the default), broadcast over the agent dim as TorchRL's
    MAPPO example expands them.

    Contract: `__call__(batch)` takes a batch `[*env_batch, T]` (time last) with the value
    network's inputs at the root and under `"next"`, the reward and done flags under `"next"`
    and, optionally, terminated flags (done when missing). It returns a shallow copy of the
    batch with the advantage and value target (shaped like the reward) and the value under the
    value key and under `("next", <value key>)`. The input batch is not modified. Values are
    computed without gradient, in one call of the network on the observations and next
    observations together.

    Args:
        gamma: discount factor, in [0, 1].
        lmbda: GAE's lambda, in [0, 1].
        value_network: a `TensorDictModule` (its out key names the value, usually
            `"state_value"`) or a plain `nn.Module` mapping an `"observation"` tensor
            `[N, *obs_shape]` to values `[N, 1]`, written under `"state_value"`; or None
            when the batch already carries the values at the root and under `"next"`.

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

        A group of 3 agents, one value per agent, env-level done flags:

        >>> agents_value = TensorDictModule(
        ...     torch.nn.Linear(3, 1), [("agents", "observation")], [("agents", "state_value")]
        ... )
        >>> grouped = TensorDict(
        ...     {
        ...         ("agents", "observation"): torch.randn(10, 3, 3),
        ...         ("next", "agents", "observation"): torch.randn(10, 3, 3),
        ...         ("next", "agents", "reward"): torch.randn(10, 3, 1),
        ...         ("next", "done"): torch.zeros(10, 1, dtype=torch.bool),
        ...     },
        ...     batch_size=[10],
        ... )
        >>> gae = GAE(0.99, 0.95, agents_value).set_keys(
        ...     reward=("agents", "reward"),
        ...     advantage=("agents", "advantage"),
        ...     value_target=("agents", "value_target"),
        ... )
        >>> gae(grouped)["agents", "advantage"].shape
        torch.Size([10, 3, 1])
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
        self.keys = GAEKeys()
        self._module_keys: tuple[list[NestedKey], list[NestedKey]] = ([], [])
        if value_network is None:
            return  # the batch brings its values, as TorchRL's GAE(value_network=None) takes
        if not isinstance(value_network, nn.Module):
            raise TypeError(
                f"value_network must be a TensorDictModule or an nn.Module, got "
                f"{type(value_network).__name__}; wrap a function in an nn.Module."
            )
        if isinstance(value_network, TensorDictModuleBase):
            self.is_tensordict_module = True
            self._module_keys = (list(value_network.in_keys), list(value_network.out_keys))
            self.keys = GAEKeys(value=_value_key_of(value_network))

    @property
    def value_key(self) -> NestedKey:
        """Where the value is written (or read, without a value network)."""
        return self.keys.value

    @property
    def in_keys(self) -> list[NestedKey]:
        """What the value network reads, at the root and under `"next"`."""
        if self.is_tensordict_module:
            return list(self._module_keys[0])
        return [self.keys.observation] if self.value_network is not None else []

    def set_keys(self, **keys: NestedKey | Sequence[str]) -> GAE:
        """Set the keys GAE reads and writes, by the names of TorchRL's `GAE.set_keys`
        (`advantage`, `value_target`, `value`, `reward`, `done`, `terminated`) and
        `observation`; see `GAEKeys`. Returns this GAE, to chain after construction.

        Raises:
            TypeError: for a name not in `GAEKeys`, or a key that is not a string or a tuple
                of strings.
            ValueError: for a `value` key the value network does not write.
        """
        checked = replaced_keys(self.keys, keys)
        value_key = checked.value if "value" in keys else None
        if value_key is not None and self.is_tensordict_module:
            out_keys = self._module_keys[1]
            if value_key not in out_keys:
                raise ValueError(
                    f"set_keys(value={value_key!r}): the value network writes {out_keys}; "
                    "pass one of them, or change the network's out_keys."
                )
        self.keys = checked
        return self

    @torch.no_grad()
    def values(self, batch: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        """Return V(obs) and V(next_obs), each `[*batch, *value_shape]`, from one network call
        (or, without a network, the batch's own values at the root and under `"next"`).
        """
        if self.value_network is None:
            return self._values_in(batch)
        if self.is_tensordict_module:
            in_keys = self.in_keys
            inputs = torch.cat(
                [
                    batch.select(*in_keys).reshape(-1),
                    batch.get(NEXT).select(*in_keys).reshape(-1),
                ]
            )
            value = self.value_network(inputs).get(self.value_key)
        else:
            observation = self._read(batch, "observation", self.keys.observation)
            next_observation = self._read(batch, "observation", under_next(self.keys.observation))
            feature_shape = observation.shape[batch.ndim :]
            value = self.value_network(
                torch.cat(
                    [
                        observation.reshape(batch.numel(), *feature_shape),
                        next_observation.reshape(batch.numel(), *feature_shape),
                    ]
                )
            )
            if value.ndim == 1:
                value = value.unsqueeze(-1)
        value = value.reshape(2, *batch.shape, *value.shape[1:])
        return value[0], value[1]

    def _values_in(self, batch: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        keys = (self.value_key, under_next(self.value_key))
        missing = [key for key in keys if batch.get(key, None) is None]
        if missing:
            raise KeyError(
                f"GAE(value_network=None) reads the values from the batch, which lacks "
                f"{missing}; add them (e.g. with your value network), pass value_network, or "
                "point set_keys(value=...) at them."
            )
        return batch.get(keys[0]), batch.get(keys[1])

    @staticmethod
    def _read(batch: TensorDictBase, name: str, key: NestedKey) -> torch.Tensor:
        """The entry at `key`, or a KeyError naming the entries of the same name there are."""
        found = batch.get(key, None)
        if found is not None:
            return found
        leaf = key[-1] if isinstance(key, tuple) else key
        near = [k for k in batch.keys(True, True) if (k[-1] if isinstance(k, tuple) else k) == leaf]
        raise KeyError(
            f"GAE reads the {name} at {key!r}, which the batch lacks (its {leaf!r} entries: "
            f"{near}); point GAE at yours with set_keys({name}=...)."
        )

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        """Return a shallow copy of `batch` with advantage, value target and values added."""
        if batch.ndim == 0:
            raise ValueError(
                "GAE expects a batch of shape [*env_batch, T] with time last, got batch_size=[]; "
                "unsqueeze a single step to [1]."
            )
        reward = self._read(batch, "reward", under_next(self.keys.reward))
        value, next_value = self.values(batch)
        if value.shape != reward.shape:
            raise ValueError(
                f"the value network must give one value per reward, shape {list(reward.shape)} "
                f"at {under_next(self.keys.reward)!r}, got {list(value.shape)}; make its output "
                "[..., 1] for a [..., 1] reward (per agent for a group's reward)."
            )
        advantage = self.advantage(batch, value, next_value)
        out = batch.copy()
        out.set(self.value_key, value)
        out.set(under_next(self.value_key), next_value)
        out.set(self.keys.value_target, advantage + value)
        if self.average_gae:
            advantage = self._standardized(advantage, batch.get(MASK, None))
        out.set(self.keys.advantage, advantage)
        return out

    def advantage(
        self, batch: TensorDictBase, value: torch.Tensor, next_value: torch.Tensor
    ) -> torch.Tensor:
        """Return the (unstandardized) advantage of `batch` given its values and next values."""
        reward = self._read(batch, "reward", under_next(self.keys.reward))
        done, terminated = self._flags(batch, reward)
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

    def _flags(
        self, batch: TensorDictBase, reward: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The done and terminated flags (done when the batch has no terminated flags), each
        broadcastable over `reward`."""
        done = self._flag(batch, "done", reward)
        if batch.get(under_next(self.keys.terminated), None) is None:
            return done, done
        return done, self._flag(batch, "terminated", reward)

    def _flag(self, batch: TensorDictBase, name: str, reward: torch.Tensor) -> torch.Tensor:
        """The flags called `name`, env-level ones viewed to broadcast over the agent dims."""
        key = under_next(getattr(self.keys, name))
        flags = self._read(batch, name, key)
        aligned = _aligned_flags(flags, reward, batch.ndim)
        try:
            fits = torch.broadcast_shapes(aligned.shape, reward.shape) == reward.shape
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(
                f"the {name} flags at {key!r}, shape {list(flags.shape)}, do not fit the reward "
                f"at {under_next(self.keys.reward)!r}, shape {list(reward.shape)}: expected "
                f"env-level flags {[*reward.shape[: batch.ndim], 1]} or per-agent flags "
                f"{list(reward.shape)}; point set_keys({name}=...) at such flags."
            )
        return aligned

    @staticmethod
    def _standardized(advantage: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        real = advantage if mask is None else advantage[mask]
        return (advantage - real.mean()) / real.std().clamp_min(1e-4)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(gamma={self.gamma}, lmbda={self.lmbda}, "
            f"value_key={self.value_key!r}, average_gae={self.average_gae})"
        )

"""`DoubleToFloat`: float64 observations and rewards become float32, float32 actions float64."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import NestedKey, TensorDictBase, unravel_key

from rlcollect import keys
from rlcollect.envs.specs import Bounded, Composite, TensorSpec
from rlcollect.transforms.base import Transform, as_key_list


def _float_spec(spec: TensorSpec, key: NestedKey) -> TensorSpec:
    """`spec` with dtype float32 (bounds cast too); it must be float64."""
    if spec.dtype != torch.float64:
        raise TypeError(
            f"DoubleToFloat was asked to cast {key!r}, whose spec has dtype {spec.dtype}; it "
            "casts float64 entries only. Drop the key from in_keys / in_keys_inv."
        )
    converted = spec.clone()
    converted.dtype = torch.float32
    if isinstance(spec, Bounded):
        converted.low = spec.low.float()  # type: ignore[attr-defined]
        converted.high = spec.high.float()  # type: ignore[attr-defined]
    return converted


class DoubleToFloat(Transform):
    """Casts float64 entries to float32 for the policy, and float32 actions back to float64 for
    the base env, as TorchRL's `DoubleToFloat` does. Specs change with them.

    With `in_keys=None`, every float64 observation and reward of the env is cast, and a float64
    action is cast back (`in_keys_inv`); with explicit `in_keys`, only those entries are cast,
    and actions only when `in_keys_inv` names them.

    Args:
        in_keys: float64 observation or reward keys to cast to float32.
        in_keys_inv: float64 action keys the policy writes as float32.

    Examples:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> from rlcollect.envs import GymEnv
        >>> from rlcollect.transforms import TransformedEnv
        >>> space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float64)
        >>> gym_env = gym.wrappers.TransformObservation(
        ...     gym.make("Pendulum-v1"), lambda obs: obs.astype(np.float64), space
        ... )
        >>> env = TransformedEnv(GymEnv(gym_env), DoubleToFloat())
        >>> env.observation_spec["observation"].dtype
        torch.float32
        >>> env.reset()["observation"].dtype
        torch.float32
    """

    def __init__(
        self,
        in_keys: NestedKey | Sequence[NestedKey] | None = None,
        in_keys_inv: NestedKey | Sequence[NestedKey] | None = None,
    ) -> None:
        super().__init__(in_keys=in_keys)
        self._finds_keys = in_keys is None
        self._finds_keys_inv = in_keys is None and in_keys_inv is None
        self.in_keys_inv = as_key_list(in_keys_inv, "in_keys_inv") or []
        self._requested = list(self.in_keys)
        self._reward_keys: list[NestedKey] = []
        self._observation_keys: list[NestedKey] = []

    def _cast(self, tensordict: TensorDictBase, dtype: torch.dtype) -> None:
        source = torch.float64 if dtype == torch.float32 else torch.float32
        key_list = self.in_keys if dtype == torch.float32 else self.in_keys_inv
        for key in key_list:
            value = tensordict.get(key, None)
            if value is not None and value.dtype == source:
                tensordict.set(key, value.to(dtype))

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        self._cast(tensordict_reset, torch.float32)
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        self._cast(next_tensordict, torch.float32)
        return next_tensordict

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase:
        self._cast(tensordict, torch.float64)
        return tensordict

    # --- specs ------------------------------------------------------------------------------

    @staticmethod
    def _cast_leaves(spec: Composite, requested: list[NestedKey], finds: bool) -> list[NestedKey]:
        """Cast the leaves of `spec` that are float64 (`finds`) or `requested`; their keys."""
        cast = []
        for path, leaf in spec.leaves():
            key = unravel_key(path)
            wanted = leaf.dtype == torch.float64 if finds else key in requested
            if wanted:
                spec[path] = _float_spec(leaf, key)
                cast.append(key)
        return cast

    def transform_reward_spec(self, reward_spec: TensorSpec) -> TensorSpec:
        if isinstance(reward_spec, Composite):
            self._reward_keys = self._cast_leaves(reward_spec, self._requested, self._finds_keys)
            result: TensorSpec = reward_spec
        else:
            wanted = keys.REWARD in self._requested
            if self._finds_keys:
                wanted = reward_spec.dtype == torch.float64
            self._reward_keys = [keys.REWARD] if wanted else []
            result = _float_spec(reward_spec, keys.REWARD) if wanted else reward_spec
        self._update_keys()
        return result

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        self._observation_keys = self._cast_leaves(
            observation_spec, self._requested, self._finds_keys
        )
        unknown = set(self._requested) - {*self._observation_keys, *self._reward_keys}
        if unknown:
            raise ValueError(
                f"DoubleToFloat in_keys {sorted(map(str, unknown))} are neither observations "
                f"nor rewards of the env (observations: {observation_spec.keys(True, True)}); "
                "name float64 observation or reward keys."
            )
        self._update_keys()
        return observation_spec

    def _update_keys(self) -> None:
        self.in_keys = [*self._observation_keys, *self._reward_keys]
        self.out_keys = list(self.in_keys)

    def transform_action_spec(self, action_spec: TensorSpec) -> TensorSpec:
        if isinstance(action_spec, Composite):
            requested = list(self.in_keys_inv)
            self.in_keys_inv = self._cast_leaves(action_spec, requested, self._finds_keys_inv)
            return action_spec
        if self._finds_keys_inv:
            self.in_keys_inv = [keys.ACTION] if action_spec.dtype == torch.float64 else []
        if keys.ACTION in self.in_keys_inv:
            return _float_spec(action_spec, keys.ACTION)
        return action_spec

    def __repr__(self) -> str:
        return f"DoubleToFloat(in_keys={self.in_keys}, in_keys_inv={self.in_keys_inv})"

"""`RewardSum`: the running sum of the reward over the current episode."""

from __future__ import annotations

from collections.abc import Sequence

from tensordict import NestedKey, TensorDictBase

from rlcollect import keys
from rlcollect.envs.specs import Composite, TensorSpec
from rlcollect.transforms.base import Transform


def _episode_key(reward_key: NestedKey) -> NestedKey:
    """`"reward"` -> `"episode_reward"`, and likewise under a nested key."""
    if isinstance(reward_key, str):
        return f"episode_{reward_key}"
    return (*reward_key[:-1], f"episode_{reward_key[-1]}")


class RewardSum(Transform):
    """Writes `"episode_reward"`: 0 at the reset root, and under `"next"` the sum of the rewards
    since the reset, the current step's included (TorchRL's `RewardSum`). The sum has the
    reward's shape and dtype (`[1]` float32 for Gymnasium envs).

    Args:
        in_keys: the reward keys to sum; `["reward"]` by default.
        out_keys: where the sums go; `"episode_<name>"` next to each reward by default.

    Examples:
        >>> from rlcollect.envs import GymEnv
        >>> from rlcollect.transforms import TransformedEnv
        >>> env = TransformedEnv(GymEnv("CartPole-v1"), RewardSum())
        >>> _ = env.set_seed(0)
        >>> float(env.reset()["episode_reward"])
        0.0
        >>> env.rollout(3)["next", "episode_reward"].squeeze(-1)
        tensor([1., 2., 3.])
    """

    def __init__(
        self,
        in_keys: NestedKey | Sequence[NestedKey] | None = None,
        out_keys: NestedKey | Sequence[NestedKey] | None = None,
    ) -> None:
        if in_keys is None:
            in_keys = [keys.REWARD]
        super().__init__(in_keys=in_keys, out_keys=out_keys)
        if out_keys is None:
            self.out_keys = [_episode_key(key) for key in self.in_keys]
        self._sum_specs: dict[NestedKey, TensorSpec] = {}

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        for out_key in self.out_keys:
            zero = self._sum_specs[out_key].zero()
            tensordict_reset.set(out_key, zero.to(tensordict_reset.device or zero.device))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for in_key, out_key in zip(self.in_keys, self.out_keys, strict=True):
            reward = next_tensordict.get(in_key)
            previous = tensordict.get(out_key, None)
            next_tensordict.set(out_key, reward if previous is None else previous + reward)
        return next_tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        reward_spec = self.require_parent().reward_spec
        for in_key, out_key in zip(self.in_keys, self.out_keys, strict=True):
            spec = _reward_leaf(reward_spec, in_key).clone()
            self._sum_specs[out_key] = spec
            observation_spec[out_key] = spec
        return observation_spec


def _reward_leaf(reward_spec: TensorSpec, key: NestedKey) -> TensorSpec:
    """The spec of reward `key`: the reward spec itself, or its entry when it is a Composite."""
    if isinstance(reward_spec, Composite):
        if key in reward_spec:
            return reward_spec[key]
    elif key == keys.REWARD:
        return reward_spec
    raise ValueError(
        f"RewardSum in_key {key!r} is not a reward of the env (reward spec: {reward_spec!r}); "
        f"pass in_keys naming the env's reward, e.g. in_keys=[{keys.REWARD!r}]."
    )

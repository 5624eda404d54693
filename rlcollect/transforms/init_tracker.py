"""`InitTracker`: flags the first step of every episode."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.envs.specs import Categorical, Composite
from rlcollect.transforms.base import Transform, reset_mask


class InitTracker(Transform):
    """Writes `"is_init"` (`[1]` bool): True at the root of the sub-envs a reset just started,
    False everywhere else (under `"next"` always), as TorchRL's `InitTracker` does. Recurrent
    policies read it to reset their hidden state.

    Args:
        init_key: where the flag is written.

    Examples:
        >>> from rlcollect.envs import GymEnv
        >>> from rlcollect.transforms import TransformedEnv
        >>> env = TransformedEnv(GymEnv("CartPole-v1"), InitTracker())
        >>> _ = env.set_seed(0)
        >>> data = env.rollout(3)
        >>> data["is_init"].squeeze(-1), data["next", "is_init"].squeeze(-1)
        (tensor([ True, False, False]), tensor([False, False, False]))
    """

    def __init__(self, init_key: str = keys.IS_INIT) -> None:
        if not isinstance(init_key, str):
            raise TypeError(f"init_key must be a string; got {init_key!r}.")
        super().__init__(in_keys=[], out_keys=[init_key])
        self.init_key = init_key

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        done = tensordict_reset.get(keys.DONE)
        tensordict_reset.set(self.init_key, reset_mask(tensordict, done).clone())
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        done = next_tensordict.get(keys.DONE)
        next_tensordict.set(self.init_key, torch.zeros_like(done, dtype=torch.bool))
        return next_tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        flag = self.require_parent().done_spec[keys.DONE]
        observation_spec[self.init_key] = Categorical(
            2, shape=flag.shape, dtype=torch.bool, device=flag.device
        )
        return observation_spec

    def __repr__(self) -> str:
        return f"InitTracker(init_key={self.init_key!r})"

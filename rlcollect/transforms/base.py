"""`Transform`, the contract of an env transform, and `Compose`, which chains transforms.

A transform asks its container (`TransformContainer`: the transformed env, or a `Compose`) for
the env it sees, so this module never imports the env class that holds transforms.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

import torch
from tensordict import NestedKey, TensorDictBase, unravel_key
from torch import nn

from rlcollect import keys
from rlcollect.envs.specs import Composite, TensorSpec
from rlcollect.errors import MisuseError

if TYPE_CHECKING:
    from rlcollect.envs.base import EnvBase


def as_key_list(
    value: NestedKey | Sequence[NestedKey] | None, argument: str
) -> list[NestedKey] | None:
    """`value` as a list of unravelled keys (None stays None); a bare key becomes `[key]`."""
    if value is None:
        return None
    if isinstance(value, (str, tuple)):
        value = [value]
    result = []
    for key in value:
        try:
            result.append(unravel_key(key))
        except (RuntimeError, TypeError) as err:
            raise TypeError(
                f"{argument} must hold keys (strings or tuples of strings); got {key!r}. "
                'Pass e.g. ["observation"] or [("agents", "observation")].'
            ) from err
    return result


class TransformContainer(Protocol):
    """What holds a transform: the transformed env at the top, or a `Compose` inside it."""

    def env_before(self, child: Transform) -> EnvBase | None:
        """The env as `child` sees it: the base env and the transforms before `child`."""

    def view_through(self, env: EnvBase, transforms: Sequence[Transform]) -> EnvBase:
        """`env` seen through `transforms`, without attaching them; the transformed env at the
        top builds it, a `Compose` forwards the question to its own container."""


def reset_mask(tensordict: TensorDictBase, flag: torch.Tensor) -> torch.Tensor:
    """The `"_reset"` mask of `tensordict` shaped like `flag` (all True when it has none)."""
    mask = tensordict.get(keys.RESET, None)
    if mask is None:
        return torch.ones_like(flag, dtype=torch.bool)
    return mask.reshape(flag.shape).to(torch.bool)


class Transform(nn.Module):
    """Base class of env transforms; `TransformedEnv` calls its hooks around the base env.

    Contract (each hook returns what it is given, possibly updated in place):

    * `_reset(tensordict, tensordict_reset) -> tensordict_reset` runs after the base env
      reset. `tensordict` is the input of `reset` (the previous root, possibly with a bool
      `"_reset"` mask of shape `[*batch, 1]`; empty for a plain `reset()`); `tensordict_reset`
      holds the base env's fresh root for every sub-env, already passed through the earlier
      transforms. The hook writes its keys for every sub-env. Afterwards the transformed env
      keeps, for the sub-envs that `"_reset"` leaves out, every value present in `tensordict`,
      so a stateless hook may compute its reset values for all sub-envs; a hook holding
      internal per-sub-env state must itself reset only the masked sub-envs.
    * `_step(tensordict, next_tensordict) -> next_tensordict` runs after the base env step.
      `tensordict` is the root of time t, as the transformed env exposes it (the transform's
      own keys included: a counter reads its previous value there); `next_tensordict` holds
      the base env's step results passed through the earlier transforms. The hook writes its
      keys into `next_tensordict`; it must keep `done == terminated | truncated`.
    * `inv(tensordict) -> tensordict` runs before the base env step, in reverse transform
      order, on a shallow copy of the root: it maps what the policy wrote (e.g. a float32
      `"action"`) to what the base env reads. The default changes nothing.
    * `transform_done_spec`, `transform_reward_spec`, `transform_observation_spec` and
      `transform_action_spec` map the specs the transform receives to the specs it produces;
      they are called at attachment, in that order, on clones. New root keys (counters,
      trackers) belong in the observation spec: the env writes them at the root and under
      `"next"`. `self.parent` is the env as this transform sees it (the base env and the
      transforms before this one), for the hooks that need its specs.

    Transforms are `nn.Module`s: running statistics are buffers, saved by `state_dict()`.

    Args:
        in_keys: the keys the transform reads.
        out_keys: the keys it writes; defaults to `in_keys`.

    Examples:
        >>> from rlcollect.envs import GymEnv
        >>> from rlcollect.transforms import TransformedEnv
        >>> class Doubled(Transform):
        ...     def _step(self, tensordict, next_tensordict):
        ...         return next_tensordict.set("reward", 2 * next_tensordict.get("reward"))
        >>> env = TransformedEnv(GymEnv("CartPole-v1"), Doubled())
        >>> _ = env.set_seed(0)
        >>> env.rollout(3)["next", "reward"].squeeze(-1)
        tensor([2., 2., 2.])
    """

    def __init__(
        self,
        in_keys: NestedKey | Sequence[NestedKey] | None = None,
        out_keys: NestedKey | Sequence[NestedKey] | None = None,
    ) -> None:
        super().__init__()
        self.in_keys = as_key_list(in_keys, "in_keys") or []
        self.out_keys = as_key_list(out_keys, "out_keys") or list(self.in_keys)
        if self.in_keys and len(self.out_keys) != len(self.in_keys):
            raise ValueError(
                f"{type(self).__name__} needs one out_key per in_key; got in_keys="
                f"{self.in_keys} and out_keys={self.out_keys}. Pass as many of each."
            )
        self.__dict__["_container"] = None

    # --- hooks ------------------------------------------------------------------------------

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        return next_tensordict

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Map the policy's output to the base env's input (identity by default)."""
        return tensordict

    def transform_done_spec(self, done_spec: Composite) -> Composite:
        """The done spec after this transform."""
        return done_spec

    def transform_reward_spec(self, reward_spec: TensorSpec) -> TensorSpec:
        """The reward spec after this transform."""
        return reward_spec

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        """The observation spec after this transform."""
        return observation_spec

    def transform_action_spec(self, action_spec: TensorSpec) -> TensorSpec:
        """The action spec after this transform."""
        return action_spec

    # --- attachment -------------------------------------------------------------------------

    @property
    def container(self) -> TransformContainer | None:
        """The `TransformedEnv` or `Compose` holding this transform (None when detached)."""
        return self.__dict__["_container"]

    def set_container(self, container: TransformContainer | None) -> None:
        """Attach the transform to `container` (done by `TransformedEnv` and `Compose`)."""
        self.__dict__["_container"] = container

    @property
    def parent(self) -> EnvBase | None:
        """The env as this transform sees it: the base env and the transforms before it."""
        container = self.container
        return None if container is None else container.env_before(self)

    def require_parent(self) -> EnvBase:
        """`self.parent`, or an error saying the transform must be attached first."""
        parent = self.parent
        if parent is None:
            raise MisuseError(
                f"{type(self).__name__} is not attached to an env; wrap the env first: "
                f"TransformedEnv(env, {type(self).__name__}(...))."
            )
        return parent

    def __repr__(self) -> str:
        return f"{type(self).__name__}(in_keys={self.in_keys}, out_keys={self.out_keys})"


class Compose(Transform):
    """Chains transforms: hooks run in order, `inv` in reverse order.

    Args:
        *transforms: the transforms, first applied first.

    Examples:
        >>> from rlcollect.envs import GymEnv
        >>> from rlcollect.transforms import RewardSum, StepCounter, TransformedEnv
        >>> env = TransformedEnv(GymEnv("CartPole-v1"), Compose(StepCounter(), RewardSum()))
        >>> _ = env.set_seed(0)
        >>> data = env.rollout(3)
        >>> data["next", "step_count"].squeeze(-1), data["next", "episode_reward"].squeeze(-1)
        (tensor([1, 2, 3]), tensor([1., 2., 3.]))
    """

    def __init__(self, *transforms: Transform) -> None:
        super().__init__()
        for transform in transforms:
            check_transform(transform)
        self.transforms = nn.ModuleList(transforms)
        # env_before(child) per child index; views are built once per spec refresh, which
        # keeps attaching n transforms O(n^2) instead of exponential.
        self._views: dict[int, EnvBase | None] = {}

    def __iter__(self) -> Iterator[Transform]:
        return iter(self.transforms)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.transforms)

    def __getitem__(self, index: int) -> Transform:
        return self.transforms[index]  # type: ignore[return-value]

    def append(self, transform: Transform) -> None:
        """Add `transform` after the others."""
        check_transform(transform)
        self.transforms.append(transform)
        self.clear_views()
        if self.container is not None:
            transform.set_container(self)

    def set_container(self, container: TransformContainer | None) -> None:
        super().set_container(container)
        for transform in self:
            transform.set_container(self)

    def env_before(self, child: Transform) -> EnvBase | None:
        """The env as `child` sees it: this Compose's parent and the children before `child`."""
        index = next(i for i, transform in enumerate(self) if transform is child)
        if index not in self._views:
            outer = self.parent
            if outer is not None and index > 0:
                outer = self.view_through(outer, list(self)[:index])
            self._views[index] = outer
        return self._views[index]

    def view_through(self, env: EnvBase, transforms: Sequence[Transform]) -> EnvBase:
        """`env` seen through `transforms`, asked of this Compose's container (the transformed
        env at the top of the chain builds it)."""
        container = self.container
        if container is None:
            raise MisuseError(
                f"{self!r} is not attached to an env, so it cannot build the env its "
                "transforms see; wrap the env first: TransformedEnv(env, Compose(...))."
            )
        return container.view_through(env, transforms)

    def clear_views(self) -> None:
        """Forget the cached `env_before` views (their specs are stale after a change)."""
        self._views.clear()
        for transform in self:
            if isinstance(transform, Compose):
                transform.clear_views()

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        for transform in self:
            tensordict_reset = transform._reset(tensordict, tensordict_reset)
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for transform in self:
            next_tensordict = transform._step(tensordict, next_tensordict)
        return next_tensordict

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase:
        for transform in reversed(list(self)):
            tensordict = transform.inv(tensordict)
        return tensordict

    def transform_done_spec(self, done_spec: Composite) -> Composite:
        for transform in self:
            done_spec = transform.transform_done_spec(done_spec)
        return done_spec

    def transform_reward_spec(self, reward_spec: TensorSpec) -> TensorSpec:
        for transform in self:
            reward_spec = transform.transform_reward_spec(reward_spec)
        return reward_spec

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        for transform in self:
            observation_spec = transform.transform_observation_spec(observation_spec)
        return observation_spec

    def transform_action_spec(self, action_spec: TensorSpec) -> TensorSpec:
        for transform in self:
            action_spec = transform.transform_action_spec(action_spec)
        return action_spec

    def __repr__(self) -> str:
        inner = ", ".join(repr(transform) for transform in self)
        return f"Compose({inner})"


def check_transform(transform: object) -> None:
    """Raise a TypeError unless `transform` is an rlcollect `Transform`."""
    if not isinstance(transform, Transform):
        raise TypeError(
            f"expected an rlcollect Transform; got {type(transform).__name__}. Use the "
            "transforms of rlcollect.transforms (TorchRL's transforms work only on TorchRL envs)."
        )

"""`TransformedEnv`: an env whose resets and steps pass through a chain of transforms."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from rlcollect import keys
from rlcollect.envs.base import EnvBase
from rlcollect.transforms.base import Compose, Transform, check_transform


class TransformedEnv(EnvBase):
    """Wraps `env` so that every reset and step passes through `transform` (see `Transform`).

    The transformed env is TensorDict-first (it overrides `_reset` and `_step`); its buffer
    face (`bind`, `reset_into`, `step_and_advance_into`) is derived by `EnvBase` through views
    of the carrier, so collectors drive it like any other env. Its specs are the base env's
    specs passed through the transforms. `state_dict()` holds the transforms' buffers
    (e.g. `ObservationNorm`'s statistics).

    Args:
        env: the base env.
        transform: a transform or a `Compose`; none when omitted (see `append_transform`).

    Examples:
        >>> from rlcollect.envs import GymEnv
        >>> from rlcollect.transforms import StepCounter
        >>> env = TransformedEnv(GymEnv("CartPole-v1"), StepCounter(max_steps=4))
        >>> _ = env.set_seed(0)
        >>> data = env.rollout(10)
        >>> data["next", "step_count"].squeeze(-1)
        tensor([1, 2, 3, 4])
        >>> bool(data["next", "truncated"][-1])
        True
        >>> env.close()
    """

    def __init__(self, env: EnvBase, transform: Transform | None = None) -> None:
        self._setup(env, _as_compose(transform))
        self.transform.set_container(self)
        self.refresh_specs()

    @classmethod
    def view(cls, env: EnvBase, transforms: Sequence[Transform]) -> TransformedEnv:
        """`env` seen through `transforms`, without attaching them (they keep their env).

        This is how a transform's `parent` is built: the base env and the transforms before it.
        """
        instance = cls.__new__(cls)
        instance._setup(env, Compose(*transforms))
        instance.refresh_specs()
        return instance

    def _setup(self, env: EnvBase, transform: Compose) -> None:
        if not isinstance(env, EnvBase):
            raise TypeError(
                f"TransformedEnv wraps an rlcollect EnvBase; got {type(env).__name__}. Wrap "
                "Gymnasium envs with rlcollect.envs.GymEnv first."
            )
        super().__init__(batch_size=env.batch_size, device=env.device)
        self._base_env = env
        self.transform = transform

    @property
    def base_env(self) -> EnvBase:
        """The wrapped env."""
        return self._base_env

    # --- container of the transforms (`TransformContainer`) ---------------------------------

    def env_before(self, child: Transform) -> EnvBase:
        """The env as `child` (the transform chain this env holds) sees it: the base env."""
        return self._base_env

    def view_through(self, env: EnvBase, transforms: Sequence[Transform]) -> TransformedEnv:
        """`env` seen through `transforms`: what a `Compose` asks for its children's `parent`."""
        return self.view(env, transforms)

    @property
    def group_map(self) -> dict[str, list[str]]:
        return self._base_env.group_map

    @property
    def agents_per_step(self) -> int:
        return self._base_env.agents_per_step

    def append_transform(self, transform: Transform) -> TransformedEnv:
        """Add `transform` after the others; specs are recomputed. Returns the env."""
        check_transform(transform)
        self.transform.append(transform)
        self.refresh_specs()
        return self

    # --- specs ------------------------------------------------------------------------------

    def refresh_specs(self) -> None:
        """Recompute the specs from the base env's, e.g. after a transform estimated its stats."""
        base = self._base_env
        self.transform.clear_views()
        self.done_spec = self.transform.transform_done_spec(base.done_spec.clone())
        self.reward_spec = self.transform.transform_reward_spec(base.reward_spec.clone())
        self.observation_spec = self.transform.transform_observation_spec(
            base.observation_spec.clone()
        )
        self.action_spec = self.transform.transform_action_spec(base.action_spec.clone())
        # The carrier layout follows the specs: drop what was built for the old ones.
        self._scratch = None
        self._carrier = None
        self._views = None

    # --- TensorDict face --------------------------------------------------------------------

    def _reset(self, tensordict: TensorDictBase | None) -> TensorDictBase:
        mask = None if tensordict is None else tensordict.get(keys.RESET, None)
        request = None
        if mask is not None:
            request = TensorDict({keys.RESET: mask}, batch_size=self.batch_size)
        tensordict_reset = self._base_env._reset(request)
        if tensordict is None:
            tensordict = tensordict_reset.empty()
        tensordict_reset = self.transform._reset(tensordict, tensordict_reset)
        if mask is not None:
            keep_unselected(tensordict_reset, tensordict, mask.reshape(self.batch_size))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        request = self.transform.inv(tensordict.clone(recurse=False))
        next_tensordict = self._base_env._step(request)
        return self.transform._step(tensordict, next_tensordict)

    # --- protocol ---------------------------------------------------------------------------

    def _set_seed(self, seed: int) -> int:
        return self._base_env.set_seed(seed)

    def state_dict(self) -> dict[str, Any]:
        """A copy of the transforms' buffers (running statistics, normalization constants)."""
        return {name: value.clone() for name, value in self.transform.state_dict().items()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore what `state_dict()` returned; the specs follow (e.g. a normalization's
        bounds). Statistics that do not fit the observations are refused, and the transforms
        are left as they were."""
        saved = [
            (
                module,
                {name: None if b is None else b.clone() for name, b in module._buffers.items()},
            )
            for module in self.transform.modules()
        ]
        try:
            self.transform.load_state_dict(state_dict)
            self._refresh_specs_keeping_carrier()
        except (RuntimeError, ValueError):
            for module, buffers in saved:
                module._buffers.update(buffers)
            self._refresh_specs_keeping_carrier()
            raise

    def _refresh_specs_keeping_carrier(self) -> None:
        """`refresh_specs()`, then bind the carrier again: loaded statistics change bounds,
        never the shapes a collector allocated (those that would are refused above)."""
        carrier = self._carrier
        self.refresh_specs()
        if carrier is not None:
            self.bind(carrier)

    def close(self) -> None:
        if not self.is_closed:
            self._base_env.close()
        super().close()

    def __repr__(self) -> str:
        return f"TransformedEnv(env={self._base_env!r}, transform={self.transform!r})"


def _as_compose(transform: Transform | None) -> Compose:
    if transform is None:
        return Compose()
    check_transform(transform)
    return transform if isinstance(transform, Compose) else Compose(transform)


def keep_unselected(
    result: TensorDictBase, previous: TensorDictBase, mask: torch.Tensor
) -> TensorDictBase:
    """Where `mask` (batch-shaped bool) is False, put back the entries `previous` holds."""
    present = set(previous.keys(include_nested=True, leaves_only=True))
    for key in result.keys(include_nested=True, leaves_only=True):
        if key == keys.RESET or key not in present:
            continue
        value = result.get(key)
        expanded = mask.reshape(*mask.shape, *([1] * (value.ndim - mask.ndim)))
        result.set(key, torch.where(expanded, value, previous.get(key).to(value.dtype)))
    return result

"""`ObservationNorm`: an affine normalization of observations, fixed or from running stats."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import NestedKey, TensorDictBase

from rlcollect import keys
from rlcollect.envs.specs import Bounded, Composite, TensorSpec, Unbounded
from rlcollect.errors import MisuseError
from rlcollect.transforms.base import Compose, Transform
from rlcollect.transforms.running_stats import RunningMeanStd


class ObservationNorm(Transform):
    """Normalizes observations, with TorchRL's `ObservationNorm` formula: `obs * scale + loc`,
    or `(obs - loc) / scale` with `standard_normal=True`.

    `loc` and `scale` are given, or estimated from random rollouts by `init_stats`; with
    `running=True` they are instead the running mean and standard deviation of every
    observation the env has produced so far (updated at each step, before normalizing; reset
    observations are normalized but not counted; until two observations were seen, the
    scale is 1). The statistics are buffers: `env.state_dict()` saves them. With running
    statistics a run depends on what the env saw before, not only on its seed: restore the
    state dict too to reproduce one.

    Args:
        loc: the location (with `scale`), a number or a tensor broadcastable to the observation.
        scale: the scale (with `loc`).
        in_keys: the observations to normalize; `["observation"]` by default.
        out_keys: where the results go; `in_keys` by default.
        standard_normal: use `(obs - loc) / scale` instead of `obs * scale + loc`.
        eps: the smallest scale (default 1e-6).
        running: use running statistics instead of `loc` and `scale`.

    Examples:
        >>> from rlcollect.envs import GymEnv
        >>> from rlcollect.transforms import TransformedEnv
        >>> env = TransformedEnv(GymEnv("Pendulum-v1"), ObservationNorm(standard_normal=True))
        >>> _ = env.set_seed(0)
        >>> norm = env.transform[0]
        >>> norm.init_stats(num_iter=500)
        >>> norm.loc.shape, norm.scale.shape
        (torch.Size([3]), torch.Size([3]))
        >>> data = env.rollout(10)
        >>> bool(data["observation"].abs().max() < 10)
        True
    """

    loc: torch.Tensor | None
    scale: torch.Tensor | None

    def __init__(
        self,
        loc: float | torch.Tensor | None = None,
        scale: float | torch.Tensor | None = None,
        in_keys: NestedKey | Sequence[NestedKey] | None = None,
        out_keys: NestedKey | Sequence[NestedKey] | None = None,
        standard_normal: bool = False,
        eps: float | None = None,
        running: bool = False,
    ) -> None:
        if (loc is None) != (scale is None):
            raise ValueError(
                f"ObservationNorm needs both loc and scale, or neither; got loc={loc!r} and "
                f"scale={scale!r}. Pass neither and call init_stats() to estimate them."
            )
        if running and loc is not None:
            raise ValueError(
                "ObservationNorm(running=True) computes loc and scale itself; drop loc and "
                "scale, or use running=False to normalize with them."
            )
        super().__init__(in_keys=in_keys or [keys.OBSERVATION], out_keys=out_keys)
        self.standard_normal = bool(standard_normal)
        self.running = bool(running)
        self.eps = 1e-6 if eps is None else float(eps)
        if loc is not None and not isinstance(loc, torch.Tensor):
            loc = torch.tensor(loc, dtype=torch.get_default_dtype())
        if scale is not None and not isinstance(scale, torch.Tensor):
            scale = torch.tensor(scale, dtype=torch.get_default_dtype()).clamp_min(self.eps)
        self.register_buffer("loc", loc)
        self.register_buffer("scale", scale)
        self.stats = RunningMeanStd(self.eps) if running else None

    @property
    def initialized(self) -> bool:
        """Whether the transform can normalize (stats given, estimated, or running)."""
        return self.running or self.loc is not None

    # --- hooks ------------------------------------------------------------------------------

    def _normalize(self, value: torch.Tensor) -> torch.Tensor:
        if self.stats is not None:
            mean, std = self.stats.mean_std()
            return ((value - mean) / std).to(value.dtype)
        if self.loc is None or self.scale is None:
            raise MisuseError(
                "ObservationNorm has no loc and scale; pass them to the constructor, call "
                "init_stats(num_iter) on the attached transform, or use running=True."
            )
        if self.standard_normal:
            return (value - self.loc) / self.scale
        return value * self.scale + self.loc

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        for in_key, out_key in zip(self.in_keys, self.out_keys, strict=True):
            tensordict_reset.set(out_key, self._normalize(tensordict_reset.get(in_key)))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        if self.stats is not None:
            batch_dims = next_tensordict.batch_dims
            for in_key in self.in_keys:
                self.stats.update(next_tensordict.get(in_key), batch_dims)
        for in_key, out_key in zip(self.in_keys, self.out_keys, strict=True):
            next_tensordict.set(out_key, self._normalize(next_tensordict.get(in_key)))
        return next_tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        for in_key, out_key in zip(self.in_keys, self.out_keys, strict=True):
            spec = observation_spec[in_key]
            self._check_broadcast(in_key, spec)
            observation_spec[out_key] = self._normalized_spec(spec)
        return observation_spec

    def _check_broadcast(self, key: NestedKey, spec: TensorSpec) -> None:
        if self.loc is None or self.scale is None:
            return
        try:
            shape = torch.broadcast_shapes(self.loc.shape, self.scale.shape, spec.shape)
        except RuntimeError:
            shape = None
        if shape != spec.shape:
            raise ValueError(
                f"ObservationNorm loc {tuple(self.loc.shape)} and scale "
                f"{tuple(self.scale.shape)} do not broadcast to {key!r} of shape "
                f"{tuple(spec.shape)}; give one value per feature, or a scalar."
            )

    def _normalized_spec(self, spec: TensorSpec) -> TensorSpec:
        if self.stats is not None or self.loc is None:
            dtype = spec.dtype if spec.dtype.is_floating_point else torch.float32
            return Unbounded(shape=spec.shape, dtype=dtype, device=spec.device)
        if isinstance(spec, Bounded):
            low, high = self._normalize(spec.low), self._normalize(spec.high)
            low, high = torch.minimum(low, high), torch.maximum(low, high)
            return Bounded(low, high, shape=spec.shape, dtype=low.dtype, device=spec.device)
        dtype = self._normalize(spec.zero()).dtype
        return Unbounded(shape=spec.shape, dtype=dtype, device=spec.device)

    # --- statistics -------------------------------------------------------------------------

    def init_stats(
        self,
        num_iter: int,
        reduce_dim: int | tuple[int, ...] = 0,
        cat_dim: int | None = None,
        key: NestedKey | None = None,
        keep_dims: tuple[int, ...] | None = None,
    ) -> None:
        """Estimate `loc` and `scale` from random rollouts of the env this transform sees.

        Rollouts of `self.parent` (the base env and the transforms before this one) with
        random actions run until `num_iter` frames are gathered; they are concatenated along
        `cat_dim` (default `reduce_dim`) and `key` (default the first in_key) is reduced
        over `reduce_dim` (mean and standard deviation), keeping `keep_dims` as size-1 dims.
        As TorchRL's `init_stats`, which has the same arguments.
        """
        if self.running or self.initialized:
            raise MisuseError(
                "ObservationNorm.init_stats estimates loc and scale once; this transform "
                f"{'uses running stats' if self.running else 'already has them'}. Create a "
                "new ObservationNorm() without loc and scale to estimate them."
            )
        if cat_dim is None:
            if not isinstance(reduce_dim, int):
                raise ValueError("init_stats needs cat_dim when reduce_dim is a tuple.")
            cat_dim = reduce_dim
        reduce_dims = [reduce_dim] if isinstance(reduce_dim, int) else list(reduce_dim)
        if cat_dim not in reduce_dims:
            raise ValueError(f"cat_dim={cat_dim} must be one of reduce_dim={reduce_dim}.")
        if key is None and len(self.in_keys) > 1:
            raise ValueError(f"init_stats needs key= to pick one of in_keys {self.in_keys}.")
        data = self._gather(num_iter, self.in_keys[0] if key is None else key, cat_dim)
        loc, scale = _mean_std(data, reduce_dims, keep_dims or ())
        if not self.standard_normal:
            scale = 1 / scale.clamp_min(self.eps)
            loc = -loc * scale
        self.loc, self.scale = loc, scale.clamp_min(self.eps)
        _refresh_owner_specs(self)

    def _gather(self, num_iter: int, key: NestedKey, cat_dim: int) -> torch.Tensor:
        parent = self.require_parent()
        frames, chunks = 0, []
        while frames < num_iter:
            rollout = parent.rollout(max_steps=num_iter)
            frames += rollout.numel()
            chunks.append(rollout.get(key))
        return torch.cat(chunks, cat_dim)

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        # loc and scale may still be unset here (None buffers are not loaded otherwise).
        for name in ("loc", "scale"):
            if self._buffers[name] is None and prefix + name in state_dict:
                self._buffers[name] = torch.empty_like(state_dict[prefix + name])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def __repr__(self) -> str:
        mode = "running" if self.running else f"standard_normal={self.standard_normal}"
        return f"ObservationNorm(in_keys={self.in_keys}, {mode})"


def _mean_std(
    data: torch.Tensor, reduce_dims: list[int], keep_dims: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard deviation of `data` over `reduce_dims`, keeping `keep_dims` as 1s."""
    dims = sorted(dim if dim < 0 else dim - data.ndim for dim in reduce_dims)
    kept = {dim if dim < 0 else dim - data.ndim for dim in keep_dims}
    if not kept <= set(dims):
        raise ValueError(f"keep_dims={tuple(keep_dims)} must be part of reduce_dim={dims}.")
    loc = data.mean(dims, keepdim=True)
    scale = data.std(dims, keepdim=True)
    squeeze = [dim for dim in dims if dim not in kept]
    if squeeze:
        loc, scale = loc.squeeze(tuple(squeeze)), scale.squeeze(tuple(squeeze))
    if not (torch.isfinite(loc).all() and torch.isfinite(scale).all()):
        raise ValueError("init_stats found non-finite statistics; check the observations.")
    return loc, scale


def _refresh_owner_specs(transform: Transform) -> None:
    """Recompute the specs of the env that holds `transform`, if it is attached."""
    from rlcollect.transforms.transformed_env import TransformedEnv

    container = transform.container
    while isinstance(container, Compose):
        container = container.container
    if isinstance(container, TransformedEnv):
        container.refresh_specs()

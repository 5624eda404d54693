"""`CatFrames`: concatenates the last N observations along a feature dim."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from tensordict import NestedKey, TensorDictBase

from rlcollect import keys
from rlcollect.envs.specs import Bounded, Categorical, Composite, OneHot, TensorSpec
from rlcollect.transforms.base import Transform

Padding = Literal["same", "constant"]


class CatFrames(Transform):
    """Replaces each observation by the concatenation of the last `N` ones along `dim`, oldest
    first, as TorchRL's `CatFrames` does. At a reset the window is padded with the reset
    observation repeated (`padding="same"`) or with `padding_value` (`padding="constant"`).

    The window lives in the data, not in the transform: step t+1's window is step t's root
    window shifted by one frame, so partial resets of batched envs need no bookkeeping.

    Args:
        N: the number of frames in the window.
        dim: the (negative) feature dim to concatenate along.
        in_keys: the observations to stack; `["observation"]` by default.
        out_keys: where the windows go; `in_keys` by default (replacing the observations).
        padding: `"same"` or `"constant"`.
        padding_value: the fill value of `padding="constant"`.

    Examples:
        >>> from rlcollect.envs import GymEnv
        >>> from rlcollect.transforms import TransformedEnv
        >>> env = TransformedEnv(GymEnv("CartPole-v1"), CatFrames(N=3, dim=-1))
        >>> env.observation_spec["observation"].shape
        torch.Size([12])
        >>> _ = env.set_seed(0)
        >>> root = env.reset()
        >>> bool((root["observation"][:4] == root["observation"][8:]).all())
        True
    """

    def __init__(
        self,
        N: int,  # noqa: N803 -- TorchRL's argument name
        dim: int = -1,
        in_keys: NestedKey | Sequence[NestedKey] | None = None,
        out_keys: NestedKey | Sequence[NestedKey] | None = None,
        padding: Padding = "same",
        padding_value: float = 0.0,
    ) -> None:
        if isinstance(N, bool) or not isinstance(N, int) or N < 1:
            raise ValueError(f"N must be a positive integer; got {N!r}.")
        if dim >= 0:
            raise ValueError(
                f"dim must be negative (counted from the last feature dim) so that it does not "
                f"depend on the env batch size; got dim={dim}. Use e.g. dim=-1."
            )
        if padding not in ("same", "constant"):
            raise ValueError(f"padding must be 'same' or 'constant'; got {padding!r}.")
        super().__init__(in_keys=in_keys or [keys.OBSERVATION], out_keys=out_keys)
        self.N = N
        self.dim = dim
        self.padding = padding
        self.padding_value = padding_value

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        for in_key, out_key in zip(self.in_keys, self.out_keys, strict=True):
            frame = tensordict_reset.get(in_key)
            if self.padding == "same":
                frames = [frame] * self.N
            else:
                frames = [torch.full_like(frame, self.padding_value)] * (self.N - 1) + [frame]
            tensordict_reset.set(out_key, torch.cat(frames, self.dim))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for in_key, out_key in zip(self.in_keys, self.out_keys, strict=True):
            frame = next_tensordict.get(in_key)
            window = tensordict.get(out_key, None)
            if window is None:
                raise KeyError(
                    f"CatFrames found no {out_key!r} window in the tensordict given to step; "
                    "step from the root that reset() or step_and_maybe_reset() returned."
                )
            width = frame.size(self.dim)
            kept = window.narrow(self.dim, width, (self.N - 1) * width)
            next_tensordict.set(out_key, torch.cat([kept, frame.to(window.dtype)], self.dim))
        return next_tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        batch_dims = len(self.require_parent().batch_size)
        for in_key, out_key in zip(self.in_keys, self.out_keys, strict=True):
            spec = observation_spec[in_key]
            feature_dims = len(spec.shape) - batch_dims
            if -self.dim > feature_dims:
                raise ValueError(
                    f"CatFrames dim={self.dim} is out of range for {in_key!r}, which has "
                    f"{feature_dims} feature dim(s) (spec shape {tuple(spec.shape)}); use a "
                    f"dim between -{feature_dims} and -1."
                )
            observation_spec[out_key] = self._stacked_spec(spec, in_key)
        return observation_spec

    def _stacked_spec(self, spec: TensorSpec, key: NestedKey) -> TensorSpec:
        if isinstance(spec, (OneHot, Composite)):
            raise TypeError(
                f"CatFrames cannot stack {key!r} with a {type(spec).__name__} spec; stack "
                "tensor observations with box, categorical or binary specs."
            )
        stacked = spec.clone()
        shape = list(spec.shape)
        shape[self.dim] *= self.N
        stacked.shape = torch.Size(shape)
        if isinstance(spec, Bounded):
            stacked.low = torch.cat([spec.low] * self.N, self.dim)  # type: ignore[attr-defined]
            stacked.high = torch.cat([spec.high] * self.N, self.dim)  # type: ignore[attr-defined]
        if isinstance(spec, Categorical) and spec.n.ndim >= -self.dim:
            stacked.n = torch.cat([spec.n] * self.N, self.dim)  # type: ignore[attr-defined]
        return stacked

    def __repr__(self) -> str:
        return f"CatFrames(N={self.N}, dim={self.dim}, in_keys={self.in_keys})"

"""Conversion of Gymnasium spaces to specs, and of Gymnasium values to and from carrier rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlcollect import keys
from rlcollect.envs.specs import Binary, Bounded, Categorical, Composite, OneHot, TensorSpec


def spec_from_space(space: gym.Space, categorical_action_encoding: bool = False) -> TensorSpec:
    """The spec of a Gymnasium space, with TorchRL's conventions.

    `Discrete` becomes `OneHot` (or `Categorical` of shape `[]` with
    `categorical_action_encoding`), `MultiDiscrete` becomes `Categorical` with one bound per
    element, `MultiBinary` becomes `Binary` (int8), `Box` becomes `Bounded` with the box's dtype,
    and `Dict` / `Tuple` become `Composite` (tuple entries keyed "0", "1", ...).
    """
    if isinstance(space, gym.spaces.Box):
        dtype = torch.from_numpy(np.zeros((), dtype=space.dtype)).dtype
        low = torch.as_tensor(space.low, dtype=dtype)
        high = torch.as_tensor(space.high, dtype=dtype)
        return Bounded(low, high, shape=space.shape, dtype=dtype)
    if isinstance(space, gym.spaces.Discrete):
        if categorical_action_encoding:
            return Categorical(int(space.n), shape=())
        return OneHot(int(space.n))
    if isinstance(space, gym.spaces.MultiDiscrete):
        return Categorical(torch.as_tensor(space.nvec, dtype=torch.int64))
    if isinstance(space, gym.spaces.MultiBinary):
        return Binary(shape=space.shape if space.shape else (int(space.n),))
    if isinstance(space, gym.spaces.Dict):
        return Composite(
            {
                name: spec_from_space(sub, categorical_action_encoding)
                for name, sub in space.spaces.items()
            }
        )
    if isinstance(space, gym.spaces.Tuple):
        return Composite(
            {
                str(index): spec_from_space(sub, categorical_action_encoding)
                for index, sub in enumerate(space.spaces)
            }
        )
    raise TypeError(
        f"Gymnasium space {space!r} is not supported; use Box, Discrete, MultiDiscrete, "
        "MultiBinary, Dict or Tuple (or wrap the env to flatten it)."
    )


def observation_spec_from_space(
    space: gym.Space, categorical_action_encoding: bool = False
) -> Composite:
    """The env's observation Composite: `"observation"` for a single space, one key per entry of a
    `Dict` space (nested dicts give nested keys), as TorchRL's `GymEnv` does."""
    spec = spec_from_space(space, categorical_action_encoding)
    if isinstance(space, gym.spaces.Dict):
        return spec  # type: ignore[return-value]
    return Composite({keys.OBSERVATION: spec})


@dataclass
class ValuePath:
    """Where one observation leaf lives in a Gymnasium observation, and how it is encoded."""

    key: tuple[str, ...]
    path: tuple[Any, ...]
    one_hot: bool
    start: Any = None

    def extract(self, observation: Any) -> Any:
        for part in self.path:
            observation = observation[part]
        if self.start is not None:
            observation = observation - self.start
        return observation


def index_start(space: gym.Space) -> Any:
    """The `start` of a Discrete / MultiDiscrete space (indices are stored from 0), or None."""
    start = getattr(space, "start", None)
    return start if start is not None and np.any(start) else None


def observation_paths(
    spec: Composite, is_dict_space: bool, space: gym.Space | None = None
) -> list[ValuePath]:
    """One `ValuePath` per observation leaf, mapping carrier keys to Gymnasium values."""
    paths = []
    for key, leaf in spec.leaves():
        gym_path: tuple[Any, ...] = key if is_dict_space else key[1:]
        gym_path = tuple(int(part) if part.isdigit() else part for part in gym_path)
        leaf_space = space
        for part in gym_path if space is not None else ():
            leaf_space = leaf_space[part]  # type: ignore[index]
        start = index_start(leaf_space) if leaf_space is not None else None
        paths.append(ValuePath(key, gym_path, isinstance(leaf, OneHot), start))
    return paths


def write_value(rows: np.ndarray, t: int, value: Any, one_hot: bool) -> None:
    """Write one Gymnasium value into row `t` of a NumPy view of the carrier."""
    if one_hot:
        rows[t] = 0
        rows[t, int(value)] = 1
    else:
        rows[t] = value


def action_reader(spec: TensorSpec, space: gym.Space) -> Callable[[np.ndarray], Any]:
    """A function turning a NumPy action row of the carrier into what `space` accepts."""
    start = index_start(space)
    offset = 0 if start is None else start
    if isinstance(spec, OneHot):
        return lambda row: int(row.argmax()) + offset
    if isinstance(space, gym.spaces.Discrete):
        return lambda row: int(row) + offset
    if isinstance(space, gym.spaces.Box):
        return lambda row: row.astype(space.dtype, copy=False)
    return lambda row: np.array(row) + offset

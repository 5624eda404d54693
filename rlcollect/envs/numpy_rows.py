"""`NumpyRows`: NumPy views of a carrier, where the Gymnasium envs' buffer face writes each step.

`GymEnv` and `GymVectorEnv` bind them once per carrier (`bind_numpy_rows` in their `_bind`);
a step then stores into the views, which share memory with the carrier's tensors, so no tensor
or TensorDict is built per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.envs.gym_spaces import ValuePath


@dataclass(frozen=True, slots=True)
class NumpyRows:
    """The carrier's tensors as NumPy arrays of shape `[*batch, L + 1, *feature]`.

    Attributes:
        root_observations: one array per observation path, at the root.
        next_observations: one array per observation path, under `"next"`.
        action: the root `"action"`.
        reward: `("next", "reward")`.
        root_flags: the root `done`, `terminated`, `truncated` (the order of `keys.DONE_KEYS`).
        next_flags: the same flags under `"next"`.
    """

    root_observations: list[np.ndarray]
    next_observations: list[np.ndarray]
    action: np.ndarray
    reward: np.ndarray
    root_flags: list[np.ndarray]
    next_flags: list[np.ndarray]


def bind_numpy_rows(
    carrier: TensorDictBase, paths: Sequence[ValuePath], env_name: str
) -> NumpyRows:
    """The NumPy views of `carrier` that an env of name `env_name` writes through, with one
    observation array per entry of `paths`.

    Raises:
        ValueError: when the carrier is not on the CPU (NumPy views need CPU memory).
    """
    if carrier.device is not None and carrier.device.type != "cpu":
        raise ValueError(
            f"{env_name} writes through NumPy views and needs a CPU carrier; got one on "
            f"{carrier.device}. Keep env_device='cpu' and set storing_device instead."
        )
    next_td = carrier.get(keys.NEXT)
    return NumpyRows(
        root_observations=[carrier.get(path.key).numpy() for path in paths],
        next_observations=[next_td.get(path.key).numpy() for path in paths],
        action=carrier.get(keys.ACTION).numpy(),
        reward=next_td.get(keys.REWARD).numpy(),
        root_flags=[carrier.get(name).numpy() for name in keys.DONE_KEYS],
        next_flags=[next_td.get(name).numpy() for name in keys.DONE_KEYS],
    )

"""Tests for the NumPy-rows binder that GymEnv and GymVectorEnv share."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlcollect.envs import GymEnv, GymVectorEnv, allocate_carrier
from rlcollect.envs.numpy_rows import bind_numpy_rows
from rlcollect.keys import ACTION, DONE_KEYS, NEXT, OBSERVATION, REWARD

ENVS = {
    "gym": lambda: GymEnv("CartPole-v1"),
    "gym-vector": lambda: GymVectorEnv("CartPole-v1", 3),
}


@pytest.mark.parametrize("make_env", ENVS.values(), ids=ENVS.keys())
def test_rows_are_views_of_the_carrier(make_env: object) -> None:
    env = make_env()  # type: ignore[operator]
    carrier = allocate_carrier(env.full_spec, 4)
    rows = bind_numpy_rows(carrier, env._paths, "Env")
    rows.root_observations[0][..., 2, :] = 7.0
    rows.next_observations[0][..., 1, :] = 5.0
    rows.action[..., 3, :] = 1
    rows.reward[..., 0, :] = 2.5
    for flag in (*rows.root_flags, *rows.next_flags):
        flag[..., 1, :] = True
    assert bool((carrier[OBSERVATION][..., 2, :] == 7.0).all())
    assert bool((carrier[NEXT, OBSERVATION][..., 1, :] == 5.0).all())
    assert bool((carrier[ACTION][..., 3, :] == 1).all())
    assert bool((carrier[NEXT, REWARD][..., 0, :] == 2.5).all())
    for name in DONE_KEYS:
        assert bool(carrier[name][..., 1, :].all())
        assert bool(carrier[NEXT, name][..., 1, :].all())
        assert not bool(carrier[name][..., 0, :].any())
    assert all(isinstance(array, np.ndarray) for array in rows.root_flags)
    env.close()


@pytest.mark.parametrize("make_env", ENVS.values(), ids=ENVS.keys())
def test_a_non_cpu_carrier_is_refused_naming_the_env(make_env: object) -> None:
    env = make_env()  # type: ignore[operator]
    carrier = allocate_carrier(env.full_spec, 2).to(torch.device("meta"))
    name = type(env).__name__
    with pytest.raises(ValueError, match=rf"{name} writes through NumPy views and needs a CPU"):
        env.bind(carrier)
    env.close()

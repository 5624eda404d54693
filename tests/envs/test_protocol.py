"""Tests for EnvProtocol: rlcollect's and TorchRL's envs satisfy it, and `run_rollout` needs
nothing more from an env."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torchrl.envs import GymEnv as TorchRLGymEnv

from rlcollect.envs import GymEnv, GymVectorEnv, SerialEnv
from rlcollect.envs.protocol import EnvProtocol
from rlcollect.envs.rollout import run_rollout
from rlcollect.keys import NEXT, OBSERVATION, TIME_DIM_NAME
from rlcollect.testing import CountingEnv, TensorDictCountingEnv
from rlcollect.transforms import StepCounter, TransformedEnv

ENVS: dict[str, Callable[[], object]] = {
    "gym": lambda: GymEnv("CartPole-v1"),
    "gym-vector": lambda: GymVectorEnv("CartPole-v1", 2),
    "serial": lambda: SerialEnv(2, "CartPole-v1"),
    "counting": lambda: CountingEnv(batch_size=(2,)),
    "tensordict-counting": lambda: TensorDictCountingEnv(batch_size=(2,)),
    "transformed": lambda: TransformedEnv(CountingEnv(), StepCounter(3)),
    "torchrl": lambda: TorchRLGymEnv("CartPole-v1"),
}


@pytest.mark.parametrize("make_env", ENVS.values(), ids=ENVS.keys())
def test_envs_satisfy_the_protocol(make_env: Callable[[], object]) -> None:
    env = make_env()
    assert isinstance(env, EnvProtocol)
    env.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("missing", ["step_and_maybe_reset", "done_keys", "rand_action"])
def test_an_object_without_a_member_is_not_an_env(missing: str) -> None:
    members = {name: None for name in dir(EnvProtocol) if not name.startswith("_")}
    del members[missing]
    assert not isinstance(type("Partial", (), members)(), EnvProtocol)


def test_run_rollout_drives_a_torchrl_env_through_the_protocol() -> None:
    env = TorchRLGymEnv("CartPole-v1")
    env.set_seed(0)
    data = run_rollout(env, 6, None, auto_reset=True, break_when_any_done=False, tensordict=None)
    assert data.batch_size == torch.Size([6])
    assert data.names == [TIME_DIM_NAME]
    assert data[NEXT, OBSERVATION].shape == torch.Size([6, 4])
    env.close()

"""Tests of `ParallelEnv`: shared-memory stepping, equivalence with SerialEnv, worker failures."""

from __future__ import annotations

import functools
import gc
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.envs import GymEnv, ParallelEnv, SerialEnv, allocate_carrier
from rlcollect.envs.base import EnvBase
from rlcollect.errors import MisuseError, WorkerError
from rlcollect.testing import check_env
from rlcollect.transforms import Compose, RewardSum, StepCounter, TransformedEnv

STEPS = 60  # long enough for random CartPole episodes (~20 steps) to end and reset

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]


class FailingCartPole(gym.Wrapper):
    """CartPole whose third step fails: it raises, or ends its process as a crash would."""

    def __init__(self, how: str) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.how = how
        self.steps = 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps == 3:
            if self.how == "raise":
                raise RuntimeError("the pole broke at step 3")
            if self.how == "sys.exit":
                sys.exit("the pole left at step 3")
            os._exit(3)
        return super().step(action)


def failing_env_factory() -> EnvBase:
    raise OSError("no display available for this env")


def random_actions(env: EnvBase, steps: int, seed: int) -> torch.Tensor:
    """One-hot CartPole actions of shape `[*batch, steps + 1, 2]`, the same for a given seed."""
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(0, 2, (*env.batch_size, steps + 1), generator=generator)
    return torch.nn.functional.one_hot(index, 2)


def run_buffer_face(env: EnvBase, seed: int, actions: torch.Tensor) -> TensorDictBase:
    """Seed, reset and step `env` through its buffer face; returns the filled carrier."""
    carrier = allocate_carrier(env.full_spec, steps=actions.shape[len(env.batch_size)] - 1)
    carrier.set(keys.ACTION, actions)
    env.set_seed(seed)
    env.bind(carrier)
    env.reset_into(0)
    for t in range(carrier.batch_size[-1] - 1):
        env.step_and_advance_into(t)
    return carrier


def step_ten_times(env: EnvBase) -> None:
    for t in range(10):
        env.step_and_advance_into(t)


def assert_processes_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + 5.0
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if Path(f"/proc/{pid}").exists()]
        time.sleep(0.02)
    assert not alive, f"worker processes {alive} are still there"


def test_workers_share_the_carrier_and_match_serial_env() -> None:
    env = ParallelEnv(2, lambda: SerialEnv(2, "CartPole-v1"))
    pids = env.worker_pids
    assert env.batch_size == torch.Size([2, 2])
    assert env.observation_spec[keys.OBSERVATION].shape == torch.Size([2, 2, 4])
    assert env.set_seed(5) == 9
    actions = random_actions(env, STEPS, seed=0)
    carrier = allocate_carrier(env.full_spec, steps=STEPS)
    observations = carrier.get(keys.OBSERVATION)[..., 1:, :]  # a view taken before bind
    carrier.set(keys.ACTION, actions)
    env.set_seed(5)
    env.bind(carrier)
    assert carrier.get(keys.OBSERVATION).is_shared()
    env.reset_into(0)
    for t in range(STEPS):
        env.step_and_advance_into(t)
    serial = SerialEnv(4, "CartPole-v1")
    expected = run_buffer_face(serial, 5, actions.flatten(0, 1))
    serial.close()
    assert expected[keys.NEXT, keys.DONE].sum() >= 4, "the run must cross several episode ends"
    for key in expected.keys(include_nested=True, leaves_only=True):
        assert torch.equal(carrier.get(key).flatten(0, 1), expected.get(key)), key
    assert torch.equal(observations.flatten(0, 1), expected.get(keys.OBSERVATION)[:, 1:])
    check_env(env, steps=STEPS)
    env.close()
    env.close()
    assert_processes_gone(pids)
    with pytest.raises(MisuseError, match="closed"):
        env.step_and_advance_into(0)


def test_one_env_per_worker_partial_reset_and_check_env() -> None:
    env = ParallelEnv(2, "CartPole-v1")
    env.set_seed(0)
    root = env.reset()
    root.set(keys.OBSERVATION, torch.full((2, 4), 5.0))
    root.set(keys.RESET, torch.tensor([[False], [True]]))
    result = env.reset(root)
    assert (result[keys.OBSERVATION][0] == 5.0).all()
    assert result[keys.OBSERVATION][1].abs().max() < 0.05
    check_env(env, steps=STEPS)
    env.close()


def test_set_seed_gives_sub_env_i_seed_plus_i_and_returns_the_next_free_seed() -> None:
    env = ParallelEnv(2, "CartPole-v1")
    assert env.set_seed(11) == 13
    actions = random_actions(env, STEPS, seed=6)
    batched = run_buffer_face(env, 11, actions)
    env.close()
    assert batched[keys.NEXT, keys.DONE].any(), "the run must cross an episode end"
    for index in range(2):
        single = GymEnv("CartPole-v1")
        expected = run_buffer_face(single, 11 + index, actions[index])
        single.close()
        assert (batched[index] == expected).all(), f"sub-env {index} differs"


def test_garbage_collection_stops_the_workers() -> None:
    env = ParallelEnv(2, "CartPole-v1")
    pids = env.worker_pids
    env.set_seed(0)
    env.rollout(3)
    del env
    gc.collect()
    assert_processes_gone(pids)


def test_exception_in_a_sub_env_raises_worker_error_and_closes() -> None:
    env = ParallelEnv(2, [functools.partial(FailingCartPole, "raise"), "CartPole-v1"])
    pids = env.worker_pids
    carrier = allocate_carrier(env.full_spec, steps=10)
    carrier.set(keys.ACTION, random_actions(env, 10, seed=0))
    env.bind(carrier)
    env.reset_into(0)
    started = time.monotonic()
    with pytest.raises(WorkerError, match="the pole broke at step 3") as caught:
        step_ten_times(env)
    assert time.monotonic() - started < 10.0
    assert caught.value.worker == 0
    assert "RuntimeError" in str(caught.value)
    assert "Traceback" in caught.value.remote_traceback
    assert "in step" in caught.value.remote_traceback
    assert env.is_closed
    assert_processes_gone(pids)


def test_exception_in_step_through_the_tensordict_face() -> None:
    env = ParallelEnv(2, ["CartPole-v1", functools.partial(FailingCartPole, "raise")])
    pids = env.worker_pids
    env.set_seed(0)
    started = time.monotonic()
    with pytest.raises(WorkerError, match="worker 1 failed: step_into") as caught:
        env.rollout(10, break_when_any_done=False)
    assert time.monotonic() - started < 10.0
    message = str(caught.value)
    assert "RuntimeError: the pole broke at step 3" in message
    assert "--- traceback in worker 1 ---\nTraceback (most recent call last)" in message
    assert 'raise RuntimeError("the pole broke at step 3")' in message
    assert env.is_closed
    assert_processes_gone(pids)
    with pytest.raises(MisuseError, match="closed"):
        env.reset()


def test_sys_exit_in_a_sub_env_is_reported_with_its_traceback() -> None:
    env = ParallelEnv(2, ["CartPole-v1", functools.partial(FailingCartPole, "sys.exit")])
    pids = env.worker_pids
    env.set_seed(0)
    with pytest.raises(WorkerError, match="SystemExit: the pole left at step 3") as caught:
        env.rollout(10, break_when_any_done=False)
    assert 'sys.exit("the pole left at step 3")' in caught.value.remote_traceback
    assert env.is_closed
    assert_processes_gone(pids)


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_dead_worker_is_reported(how: str) -> None:
    env = ParallelEnv(2, functools.partial(FailingCartPole, how))
    pids = env.worker_pids
    carrier = allocate_carrier(env.full_spec, steps=10)
    carrier.set(keys.ACTION, random_actions(env, 10, seed=0))
    env.bind(carrier)
    env.reset_into(0)
    if how == "kill":
        os.kill(pids[1], signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(WorkerError, match=r"worker \d failed: the worker process died"):
        step_ten_times(env)
    assert time.monotonic() - started < 10.0
    assert env.is_closed
    assert_processes_gone(pids)


def test_construction_errors() -> None:
    with pytest.raises(ValueError, match="num_workers must be a positive int"):
        ParallelEnv(0, "CartPole-v1")
    with pytest.raises(ValueError, match="num_workers must be a positive int"):
        ParallelEnv(-1, "CartPole-v1")
    with pytest.raises(TypeError, match="create_env_fn must be a callable"):
        ParallelEnv(2, 42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"create_env_fn='NoSuchEnv-v0' is not a registered"):
        ParallelEnv(2, "NoSuchEnv-v0")
    with pytest.raises(ValueError, match="mp_start_method='teleport' is not available"):
        ParallelEnv(2, "CartPole-v1", mp_start_method="teleport")
    assert not multiprocessing.active_children(), "argument errors start no process"
    with pytest.raises(WorkerError, match="creating the sub-env raised OSError: no display"):
        ParallelEnv(2, failing_env_factory)


def counted_pendulum() -> EnvBase:
    return TransformedEnv(GymEnv("Pendulum-v1"), Compose(StepCounter(max_steps=4), RewardSum()))


def test_sub_env_transforms_keep_their_state_through_the_tensordict_face() -> None:
    def zero_torque(td: TensorDictBase) -> TensorDictBase:
        return td.set(keys.ACTION, torch.zeros(*td.batch_size, 1))

    serial = SerialEnv(2, counted_pendulum)
    parallel = ParallelEnv(2, counted_pendulum)
    try:
        results = []
        for env in (serial, parallel):
            env.set_seed(0)
            results.append(env.rollout(6, zero_torque, break_when_any_done=False))
        counts = results[1]["next", "step_count"][1].flatten().tolist()
        assert counts == [1, 2, 3, 4, 1, 2], "the workers' step counters did not advance"
        for key in [("next", "episode_reward"), ("next", "truncated"), ("next", "observation")]:
            assert torch.equal(results[0][key], results[1][key]), key
    finally:
        serial.close()
        parallel.close()

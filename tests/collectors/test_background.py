"""Collector with a replay buffer: iteration extends it; start() fills it in a thread."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule

from rlcollect import Collector
from rlcollect.envs import GymEnv
from rlcollect.replay import LazyTensorStorage, ReplayBuffer
from rlcollect.testing import CountingEnv, TensorDictCountingEnv
from tests.collectors.policies import GreedyPolicy


def wait_for(condition: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.005)


def bias_policy(action: int) -> TensorDictModule:
    module = GreedyPolicy()
    set_bias(module, action)
    return TensorDictModule(module, in_keys=["observation"], out_keys=["action"])


def set_bias(module: GreedyPolicy, action: int) -> None:
    with torch.no_grad():
        module.linear.weight.zero_()
        module.linear.bias.copy_(torch.nn.functional.one_hot(torch.tensor(action), 2).float())


def test_iteration_extends_buffer_and_yields_none() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(1000))
    collector = Collector(
        CountingEnv(batch_size=(2,)),
        None,
        frames_per_batch=20,
        total_frames=60,
        replay_buffer=buffer,
    )
    results = list(collector)
    assert results == [None, None, None]
    assert len(buffer) == 60
    assert buffer.write_count == 60


@pytest.mark.timeout(60)
def test_start_fills_buffer_and_pause_freezes_it() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(100_000))
    collector = Collector(
        GymEnv("CartPole-v1"),
        bias_policy(0),
        frames_per_batch=50,
        total_frames=-1,
        replay_buffer=buffer,
    )
    collector.start()
    try:
        wait_for(lambda: buffer.write_count >= 200)
        with collector.pause():
            frozen = buffer.write_count
            time.sleep(0.3)
            assert buffer.write_count == frozen
        wait_for(lambda: buffer.write_count > frozen)
    finally:
        started = time.monotonic()
        collector.async_shutdown(timeout=10)
        assert time.monotonic() - started < 5
    assert not any(t.name == "rlcollect-collector" for t in threading.enumerate())
    after = buffer.write_count
    time.sleep(0.2)
    assert buffer.write_count == after


@pytest.mark.timeout(60)
def test_weight_update_reaches_background_collection() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(100_000))
    collector = Collector(
        GymEnv("CartPole-v1"),
        bias_policy(0),
        frames_per_batch=50,
        total_frames=-1,
        replay_buffer=buffer,
    )
    collector.start()
    try:
        wait_for(lambda: buffer.write_count >= 100)
        with collector.pause():
            before = buffer.write_count
            flipped = GreedyPolicy()
            set_bias(flipped, 1)
            collector.update_policy_weights_(flipped)
        wait_for(lambda: buffer.write_count >= before + 100)
    finally:
        collector.async_shutdown(timeout=10)
    actions = buffer.storage.get(torch.arange(buffer.write_count))["action"].argmax(-1)
    assert (actions[:before] == 0).all()
    assert (actions[before:] == 1).all()


@pytest.mark.timeout(60)
def test_start_stops_at_total_frames() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(1000))
    collector = Collector(
        CountingEnv(), None, frames_per_batch=10, total_frames=50, replay_buffer=buffer
    )
    collector.start()
    wait_for(lambda: buffer.write_count == 50)
    time.sleep(0.1)
    collector.async_shutdown(timeout=5)
    assert buffer.write_count == 50


@pytest.mark.timeout(60)
def test_background_error_is_reported() -> None:
    class Broken:
        write_count = 0

        def extend(self, data: object) -> None:
            raise OSError("disk full")

    collector = Collector(CountingEnv(), None, frames_per_batch=10, replay_buffer=Broken())
    collector.start()
    time.sleep(0.2)
    with pytest.raises(RuntimeError, match="disk full"):
        collector.async_shutdown(timeout=5)


def test_start_without_buffer_is_refused() -> None:
    collector = Collector(CountingEnv(), None, frames_per_batch=10)
    with pytest.raises(RuntimeError, match="pass replay_buffer"):
        collector.start()


class SlowCountingEnv(TensorDictCountingEnv):
    """A counting env whose every step takes 20 ms: a 100-frame batch takes 2 s."""

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        time.sleep(0.02)
        return super()._step(tensordict)


@pytest.mark.timeout(60)
def test_async_shutdown_returns_within_timeout_mid_batch() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(1000))
    collector = Collector(
        SlowCountingEnv(), None, frames_per_batch=100, total_frames=-1, replay_buffer=buffer
    )
    collector.start()
    time.sleep(0.2)  # the first batch is in flight
    started = time.monotonic()
    collector.async_shutdown(timeout=0.2)
    assert time.monotonic() - started < 1.0
    wait_for(lambda: not any(t.name == "rlcollect-collector" for t in threading.enumerate()))
    assert buffer.write_count == 0, "the batch in flight was written after shutdown returned"

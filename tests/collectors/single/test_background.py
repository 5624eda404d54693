"""Collector with a replay buffer: iteration extends it; start() fills it in a thread."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule

from rlcollect import Collector
from rlcollect.envs import GymEnv
from rlcollect.errors import MisuseError
from rlcollect.replay import LazyTensorStorage, ListStorage, ReplayBuffer
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


def test_list_storage_keeps_each_batch_not_a_view_of_the_carrier() -> None:
    buffer = ReplayBuffer(storage=ListStorage(100))
    collector = Collector(
        CountingEnv(episode_length=100),
        None,
        frames_per_batch=4,
        total_frames=12,
        replay_buffer=buffer,
    )
    list(collector)
    stored = [float(buffer[i]["observation"]) for i in range(len(buffer))]
    assert stored == [float(i) for i in range(12)]


@pytest.mark.timeout(60)
def test_shutdown_abandons_the_batch_in_flight_and_counts_only_what_was_written() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(1000))
    collector = Collector(
        SlowCountingEnv(episode_length=1000), None, frames_per_batch=20, replay_buffer=buffer
    )
    collector.start()
    wait_for(lambda: buffer.write_count >= 20)
    time.sleep(0.1)  # a batch takes 0.4 s: the next one is in flight
    collector.async_shutdown(timeout=10, close_env=False)
    assert collector.frames == buffer.write_count
    written = buffer.write_count
    collector.next()
    assert buffer.write_count == written + 20
    after = buffer[torch.arange(written, written + 20)]
    before = buffer[torch.arange(written)]
    if after["observation"].flatten()[0] == 0:
        # The batch in flight was abandoned mid-trajectory: the next starts from a reset.
        assert after["collector", "traj_ids"].min() > before["collector", "traj_ids"].max()
    else:  # (a slow machine stopped between batches) the trajectory goes on, with no hole
        assert after["observation"].flatten()[0] == before["next", "observation"].flatten()[-1]
        assert after["collector", "traj_ids"][0] == before["collector", "traj_ids"][-1]


def test_a_failed_extend_is_not_counted_and_the_next_batch_restarts() -> None:
    class FailsOnce:
        def __init__(self) -> None:
            self.batches: list[TensorDictBase] = []
            self.fail = True

        def extend(self, data: TensorDictBase) -> None:
            if self.fail:
                self.fail = False
                raise OSError("disk full")
            self.batches.append(data)

    buffer = FailsOnce()
    collector = Collector(
        CountingEnv(episode_length=100), None, frames_per_batch=5, replay_buffer=buffer
    )
    with pytest.raises(OSError, match="disk full"):
        collector.next()
    assert (collector.frames, collector.iterations) == (0, 0)
    collector.next()
    assert buffer.batches[0]["observation"].flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert collector.frames == 5


@pytest.mark.timeout(30)
def test_shutdown_inside_pause_does_not_hang() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(1000))
    collector = Collector(CountingEnv(), None, frames_per_batch=10, replay_buffer=buffer)
    collector.start()
    wait_for(lambda: buffer.write_count > 0)
    with collector.pause():
        collector.shutdown()
    assert not any(t.name == "rlcollect-collector" for t in threading.enumerate())


def test_calls_that_would_race_the_thread_are_refused_unless_paused() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(10_000))
    collector = Collector(CountingEnv(), None, frames_per_batch=10, replay_buffer=buffer)
    collector.start()
    try:
        calls = {
            "next()": collector.next,
            "set_seed()": lambda: collector.set_seed(0),
            "reset()": collector.reset,
            "load_state_dict()": lambda: collector.load_state_dict(collector.state_dict()),
        }
        for name, call in calls.items():
            with pytest.raises(MisuseError, match=rf"{re.escape(name)} cannot run while"):
                call()
        with collector.pause():
            collector.set_seed(0)
            collector.reset()
            frozen = buffer.write_count
            collector.next()  # runs in this thread while the background one waits
            assert buffer.write_count == frozen + 10
    finally:
        collector.shutdown()


@pytest.mark.timeout(60)
def test_start_raises_the_unreported_error_of_the_previous_run() -> None:
    class Broken:
        def extend(self, data: object) -> None:
            raise OSError("disk full")

    collector = Collector(CountingEnv(), None, frames_per_batch=10, replay_buffer=Broken())
    collector.start()
    wait_for(lambda: not collector._background.is_running)
    with pytest.raises(RuntimeError, match="disk full"):
        collector.start()
    collector.shutdown()


LEFT_RUNNING = """
import time
from rlcollect import Collector
from rlcollect.envs import ParallelEnv
from rlcollect.replay import LazyTensorStorage, ReplayBuffer

if __name__ == "__main__":
    buffer = ReplayBuffer(storage=LazyTensorStorage(10_000))
    collector = Collector(
        ParallelEnv(2, "CartPole-v1"), None, frames_per_batch=100, replay_buffer=buffer
    )
    collector.start()
    while buffer.write_count < 200:
        time.sleep(0.01)
    print("exiting without shutdown", flush=True)
"""


@pytest.mark.timeout(120)
def test_a_collector_left_running_stops_quietly_at_exit(tmp_path: Path) -> None:
    """The thread is stopped before the env's workers close: no false failure is logged."""
    script = tmp_path / "left_running.py"
    script.write_text(LEFT_RUNNING)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=100
    )
    assert done.returncode == 0, done.stderr
    assert "exiting without shutdown" in done.stdout
    assert "background collection failed" not in done.stderr, done.stderr

"""Multi-process collectors at their edges: randomness per worker, misuse, nesting, timing."""

from __future__ import annotations

import functools
import os
import signal
import time

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from rlcollect.collectors import (
    MultiAsyncCollector,
    MultiSyncCollector,
    SharedMemWeightSyncScheme,
)
from rlcollect.errors import MisuseError, WorkerError
from rlcollect.replay import LazyTensorStorage, ReplayBuffer
from rlcollect.testing import CountingEnv
from tests.collectors.faulty_envs import hanging_env, healthy_env
from tests.collectors.policies import BiasPolicy
from tests.conftest import processes_gone

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]
PENDULUM = "Pendulum-v1"


def counting_env() -> CountingEnv:
    return CountingEnv(episode_length=7)


def random_actions(seed: int | None, nested: bool = False) -> torch.Tensor:
    options = {"collector_class": functools.partial(MultiSyncCollector, num_workers=2)}
    with MultiSyncCollector(
        PENDULUM, num_workers=2, frames_per_batch=40, **(options if nested else {})
    ) as collector:
        if seed is not None:
            collector.set_seed(seed)
        return collector.next()["action"]


def test_workers_draw_their_own_random_numbers_reproducibly() -> None:
    unseeded = random_actions(None)
    assert not torch.equal(unseeded[0], unseeded[1]), "two workers drew the same actions"
    assert not torch.equal(unseeded, random_actions(None)), "unseeded runs drew the same"
    seeded = random_actions(1)
    assert torch.equal(seeded, random_actions(1))
    assert not torch.equal(seeded, random_actions(2))
    nested = random_actions(3, nested=True)
    assert torch.equal(nested, random_actions(3, nested=True))
    assert len({tuple(row.flatten().tolist()) for row in nested.flatten(0, 1)}) == 4


def shared_buffer() -> ReplayBuffer:
    return ReplayBuffer(storage=LazyTensorStorage(4000), shared=True)


def wait_for(condition: object, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_pauses_nest() -> None:
    buffer = shared_buffer()
    with MultiSyncCollector(
        counting_env, num_workers=2, frames_per_batch=10, replay_buffer=buffer
    ) as collector:
        collector.start()
        wait_for(lambda: buffer.write_count > 50)
        with collector.pause():
            with collector.pause():
                frozen = buffer.write_count
            time.sleep(0.3)
            assert buffer.write_count == frozen, "the inner pause's end resumed the workers"
        wait_for(lambda: buffer.write_count > frozen + 50)
        with pytest.raises(MisuseError, match=r"start\(\) was already called"):
            collector.start()
        collector.async_shutdown()
    buffer.close()


def test_shutdown_abandons_batches_in_flight_at_once() -> None:
    collector = MultiAsyncCollector(
        [healthy_env, lambda: hanging_env(30)], frames_per_batch=10, worker_timeout=60
    )
    collector.next()  # worker 0's; worker 1 hangs in its first batch
    pids = collector.process_ids()
    started = time.monotonic()
    collector.shutdown()
    assert time.monotonic() - started < 2
    assert processes_gone(pids, 5)
    with pytest.raises(MisuseError, match=r"shut down; build a new one"):
        collector.next()


def test_async_length_and_buffer_writes_stop_at_total_frames() -> None:
    with MultiAsyncCollector(
        counting_env, num_workers=2, frames_per_batch=10, total_frames=25
    ) as collector:
        assert len(collector) == 3
        assert len(list(collector)) == 3
    with MultiAsyncCollector(
        counting_env, num_workers=2, frames_per_batch=[4, 9], total_frames=50
    ) as collector:  # a per-worker list is summed, as in TorchRL: batches of 13
        assert len(collector) == 4
        assert [batch.numel() for batch in collector] == [13] * 4
    with pytest.raises(ValueError, match=r"frames_per_batch"):
        MultiAsyncCollector(counting_env, num_workers=2, frames_per_batch=[4, 0])
    with pytest.raises(ValueError, match=r"frames_per_batch"):
        MultiAsyncCollector(counting_env, num_workers=3, frames_per_batch=[4, 9])
    buffer = shared_buffer()
    with MultiAsyncCollector(
        counting_env, num_workers=3, frames_per_batch=10, total_frames=40, replay_buffer=buffer
    ) as collector:
        assert list(collector) == [None] * 4
        time.sleep(0.3)  # a batch still on its way would land now
    assert buffer.write_count == 40
    buffer.close()


def test_a_worker_restarted_in_the_background_writes_the_rest_of_its_share() -> None:
    buffer = shared_buffer()
    with MultiSyncCollector(
        counting_env,
        num_workers=2,
        frames_per_batch=20,
        total_frames=2000,
        replay_buffer=buffer,
        restart_dead_workers=True,
    ) as collector:
        collector.start()
        wait_for(lambda: buffer.write_count > 200)
        os.kill(collector.pool.pids[1], signal.SIGKILL)
        # Waiting on the frame count finds the dead worker, restarts and starts it again.
        wait_for(lambda: collector.is_done)
        assert [worker["restarts"] for worker in collector.stats()["per_worker"]] == [0, 1]
        collector.async_shutdown()
    # The new worker writes what was left of the share; the one batch the killed worker was
    # writing may be lost or counted in part.
    written = buffer.write_count
    buffer.close()
    assert abs(written - 2000) <= 20


def test_misuse_raises_and_the_collector_goes_on() -> None:
    with MultiSyncCollector(counting_env, num_workers=2, frames_per_batch=10) as collector:
        state = collector.state_dict()
        with pytest.raises(KeyError, match=r"the state lacks \['iterations'\]"):
            collector.load_state_dict({k: v for k, v in state.items() if k != "iterations"})
        broken = {**state, "workers": [{"frames": 0}, {"frames": 0}]}
        with pytest.raises(WorkerError, match=r"worker 0 failed: load_state_dict raised KeyError"):
            collector.load_state_dict(broken)
        with pytest.raises(TypeError, match=r"seed must be an int; got 'abc'"):
            collector.set_seed("abc")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"seed=1180591620717411303424 does not fit"):
            collector.set_seed(2**70)
        assert collector.next().batch_size == (2, 5), "the collector still works"


def test_bad_update_arguments_are_refused_before_anything_is_sent() -> None:
    policy = TensorDictModule(BiasPolicy(0.5), in_keys=["observation"], out_keys=["action"])
    policy.module.register_buffer("scale", torch.ones(1), persistent=False)
    with MultiSyncCollector(PENDULUM, policy, num_workers=2, frames_per_batch=20) as collector:
        with pytest.raises(ValueError, match=r"timeout=0 must be a positive number"):
            collector.update_policy_weights_(timeout=0)
        weights = TensorDict.from_module(policy)  # holds the non-persistent buffer too
        weights["module", "bias"] = torch.tensor([1.5])
        collector.update_policy_weights_(weights, worker_ids=np.int64(1))
        batch = collector.next()
    assert torch.all(batch["action"][0] == 0.5)
    assert torch.all(batch["action"][1] == 1.5)


def test_bad_construction_arguments_are_named() -> None:
    scheme = SharedMemWeightSyncScheme()
    policy = TensorDictModule(BiasPolicy(0.5), in_keys=["observation"], out_keys=["action"])
    schemes = {"policy": scheme}
    with (
        MultiSyncCollector(
            PENDULUM, policy, num_workers=1, frames_per_batch=10, weight_sync_schemes=schemes
        ),
        pytest.raises(ValueError, match=r"already serves a collector"),
    ):
        MultiSyncCollector(
            PENDULUM, policy, num_workers=1, frames_per_batch=10, weight_sync_schemes=schemes
        )
    with pytest.raises(ValueError, match=r"num_sub_threads=0 must be at least 1"):
        MultiSyncCollector(counting_env, num_workers=1, frames_per_batch=10, num_sub_threads=0)
    with pytest.raises(ValueError, match=r"cat_results='cat' is not supported; use 'stack'"):
        MultiAsyncCollector(counting_env, num_workers=1, frames_per_batch=10, cat_results="cat")


def test_a_worker_dying_in_the_background_is_reported_to_a_loop_waiting_on_frames() -> None:
    buffer = shared_buffer()
    collector = MultiSyncCollector(
        counting_env, num_workers=2, frames_per_batch=20, replay_buffer=buffer
    )
    collector.start()
    wait_for(lambda: buffer.write_count > 100)
    os.kill(collector.pool.pids[0], signal.SIGKILL)
    started = time.monotonic()

    def wait_for_frames_forever() -> None:
        while collector.frames < 10**9:
            time.sleep(0.01)

    with pytest.raises(WorkerError, match=r"worker 0 failed: .*died \(signal SIGKILL\)"):
        wait_for_frames_forever()
    assert time.monotonic() - started < 10
    collector.shutdown()
    buffer.close()


def test_policy_factories_one_per_worker() -> None:
    def factory(bias: float) -> TensorDictModule:
        return TensorDictModule(BiasPolicy(bias), in_keys=["observation"], out_keys=["action"])

    factories = [functools.partial(factory, 0.25), functools.partial(factory, -0.25)]
    with MultiSyncCollector(
        PENDULUM, num_workers=2, frames_per_batch=20, policy_factory=factories
    ) as collector:
        batch = collector.next()
        collector.update_policy_weights_({"module.bias": torch.tensor([1.0])})
        updated = collector.next()
    assert torch.all(batch["action"][0] == 0.25)
    assert torch.all(batch["action"][1] == -0.25)
    assert torch.all(updated["action"] == 1.0)

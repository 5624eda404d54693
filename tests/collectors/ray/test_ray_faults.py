"""Faults on a real local Ray cluster: an actor that raises or dies is reported by index within
seconds (with its traceback), and is restarted with the current weights when asked."""

from __future__ import annotations

import functools
import time
from typing import Any

import pytest
import torch

from rlcollect import keys
from rlcollect.collectors import ActorError, RayCollector
from rlcollect.collectors.children import RESTART_ID_GAP
from rlcollect.errors import MisuseError, WorkerError
from rlcollect.replay import LazyTensorStorage, RayReplayBuffer
from tests.collectors.faulty_envs import failing_env, healthy_env
from tests.collectors.policies import bias_module
from tests.collectors.ray.helpers import (
    RAY_TEST_TIMEOUT,
    REPORT_SECONDS,
    actor_handles,
    counting_env,
)
from tests.conftest import processes_gone

ray = pytest.importorskip("ray")

pytestmark = [
    pytest.mark.timeout(RAY_TEST_TIMEOUT),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]
PENDULUM = "Pendulum-v1"
VERSION = ("next", keys.POLICY_VERSION)


def wait_restarted_by_ray(handle: Any, dead_pid: int, within: float = 60.0) -> dict[str, Any]:
    """What `ready()` answers once Ray has restarted the actor of `handle` (killed in process
    `dead_pid`) in a new process; the collector is not asked anything meanwhile."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            info = ray.get(handle.ready.remote(), timeout=5)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            time.sleep(0.05)  # still restarting
            continue
        if info["pid"] != dead_pid:
            return info
    raise AssertionError(f"Ray did not restart the actor within {within} s")


def set_bias(policy: torch.nn.Module, value: float) -> None:
    with torch.no_grad():
        policy.module.bias.fill_(value)


def test_an_actor_that_raises_is_reported_by_index_with_its_traceback() -> None:
    collector = RayCollector(
        [healthy_env, functools.partial(failing_env, 15)], frames_per_batch=20
    )  # 10 frames per actor and batch: actor 1's env raises in the second batch
    collector.next()
    pids = collector.process_ids()
    start = time.monotonic()
    with pytest.raises(
        ActorError, match=r"collector actor 1 failed: collect\(\) raised .*the env broke at step 15"
    ) as caught:
        collector.next()
    assert time.monotonic() - start < REPORT_SECONDS
    assert isinstance(caught.value, WorkerError)
    assert caught.value.worker == 1
    assert "faulty_envs.py" in caught.value.remote_traceback, "the actor's own traceback"
    assert "--- traceback in collector actor 1 ---" in str(caught.value)
    with pytest.raises(MisuseError, match=r"shut down"):
        collector.next()
    assert processes_gone(pids, 15), "the failure ended every actor"


def test_an_actor_that_fails_to_build_is_named_at_construction() -> None:
    with pytest.raises(ActorError, match=r"collector actor 0 failed: ready\(\) raised") as caught:
        RayCollector(
            "NoSuchEnv-v0", num_collectors=1, frames_per_batch=8, remote_configs={"num_cpus": 0}
        )
    assert "NoSuchEnv" in str(caught.value)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_an_actor_killed_with_ray_kill_is_reported_within_seconds(sync: bool) -> None:
    collector = RayCollector(counting_env(), num_collectors=2, frames_per_batch=20, sync=sync)
    collector.next()
    ray.kill(actor_handles(collector)[1])
    start = time.monotonic()
    with pytest.raises(ActorError, match=r"collector actor 1 failed: the actor died") as caught:
        list(collector)  # endless until the failure (async: actor 0's batches may come first)
    assert time.monotonic() - start < REPORT_SECONDS
    assert "killed by `ray.kill`" in caught.value.remote_traceback
    with pytest.raises(MisuseError, match=r"shut down"):
        collector.next()


def ids_of(batch: Any) -> set[int]:
    return set(batch[keys.TRAJ_IDS].flatten().tolist())


@pytest.mark.slow
@pytest.mark.parametrize("no_restart", [False, True], ids=["ray restarts it", "made again"])
def test_a_killed_actor_comes_back_with_the_current_weights(no_restart: bool) -> None:
    policy = bias_module(0.5)
    with RayCollector(
        PENDULUM,
        policy,
        num_collectors=2,
        frames_per_batch=20,
        restart_dead_collectors=True,
        track_policy_version=True,
    ) as collector:
        collector.set_seed(3)
        first = collector.next()
        set_bias(policy, 1.25)
        collector.update_policy_weights_()
        before = collector.stats()["collectors"]
        ray.kill(actor_handles(collector)[1], no_restart=no_restart)
        assert processes_gone([before[1]["pid"]], REPORT_SECONDS)  # the kill takes a moment
        batch = collector.next()  # actor 1 comes back within the batch
        after = collector.stats()["collectors"]
        later = collector.next()
    for rows in (batch, later):
        assert torch.all(rows["action"] == 1.25), "the restarted actor got the current weights"
        assert torch.all(rows[VERSION] == 1)
    assert [actor["restarts"] for actor in after] == [0, 1]
    assert after[1]["pid"] != before[1]["pid"]
    assert after[0]["pid"] == before[0]["pid"], "the other actor kept running"
    assert not ids_of(batch[1]) & ids_of(first[1]), "fresh trajectory ids after the restart"
    assert all(value % 2 == 1 for value in ids_of(batch[1]) | ids_of(later[1]))


@pytest.mark.slow
def test_a_restarted_actor_goes_on_filling_the_buffer_while_the_other_keeps_collecting() -> None:
    rb = RayReplayBuffer(storage=LazyTensorStorage(200_000))
    with RayCollector(
        counting_env(5),
        num_collectors=2,
        frames_per_batch=20,
        replay_buffer=rb,
        restart_dead_collectors=True,
    ) as collector:  # endless: the actors write until async_shutdown()
        collector.start()
        while collector.frames < 200:
            time.sleep(0.01)
        pid = collector.stats()["collectors"][0]["pid"]
        ray.kill(actor_handles(collector)[0], no_restart=False)
        assert processes_gone([pid], REPORT_SECONDS)
        written = rb.write_count
        # Ray brings actor 0 back meanwhile; the collector has not restored it yet.
        assert wait_restarted_by_ray(actor_handles(collector)[0], pid)["restored"] is False
        deadline = time.monotonic() + 30
        while rb.write_count == written and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rb.write_count > written, "actor 1 kept writing"
        frames = collector.frames  # asking the actors has actor 0 restored; it goes on
        assert [actor["restarts"] for actor in collector.stats()["collectors"]] == [1, 0]
        deadline = time.monotonic() + 30
        while collector.frames < frames + 400 and time.monotonic() < deadline:
            time.sleep(0.01)
        collector.async_shutdown()
        assert [actor["restarts"] for actor in collector.stats()["collectors"]] == [1, 0]
        # What the killed process wrote after it last reported is counted too.
        assert collector.frames == rb.write_count
    ids = rb[torch.arange(min(len(rb), rb.write_count))][keys.TRAJ_IDS]
    restarted = ids[(ids % 2 == 0) & (ids >= 2 * RESTART_ID_GAP)]
    assert restarted.numel() > 0, "the restarted actor wrote, with trajectory ids of its own"
    rb.close()

"""RayCollector on a real local Ray cluster: shapes, frames, trajectory ids, parity, options,
state, bad arguments, and who starts and stops Ray."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from rlcollect import keys
from rlcollect.collectors import (
    Collector,
    RayCollector,
    SharedMemWeightSyncScheme,
)
from rlcollect.replay import ReplayBuffer
from rlcollect.runtime.ray_lease import RayLease
from rlcollect.testing import CountingEnv
from tests.collectors.policies import greedy_module
from tests.collectors.ray.helpers import RAY_TEST_TIMEOUT, counting_env
from tests.conftest import processes_gone
from tests.examples.script_runner import zygote
from tests.ray_session import SUBPROCESS_ENV

ray = pytest.importorskip("ray")

pytestmark = [
    pytest.mark.timeout(RAY_TEST_TIMEOUT),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]
ROOT = Path(__file__).resolve().parents[2]


def traj_ids(batch: Any) -> torch.Tensor:
    return batch[keys.TRAJ_IDS]


def assert_ids_follow_done_flags(ids: torch.Tensor, done: torch.Tensor) -> None:
    """A new trajectory id exactly where the previous step was done."""
    assert torch.equal(ids[..., 1:] != ids[..., :-1], done[..., :-1])


# --- shapes, frame counts, trajectory ids --------------------------------------------------------


def test_sync_stacks_one_batch_per_actor_with_unique_trajectory_ids() -> None:
    with RayCollector(
        counting_env(4), num_collectors=2, frames_per_batch=20, total_frames=60
    ) as collector:
        batches = list(collector)
        assert len(collector) == 3
        assert collector.frames == 60
        pids = collector.process_ids()
    assert processes_gone(pids, 15), "shutdown() ends every actor"
    collector.shutdown()  # again: nothing happens
    with pytest.raises(RuntimeError, match=r"shut down; build a new one"):
        collector.reset()
    assert ray.is_initialized(), "Ray was started by someone else: it stays"
    assert len(batches) == 3
    for batch in batches:
        assert batch.batch_size == torch.Size([2, 10])
        assert batch.names == [None, "time"]
    # Row i is actor i's own run: counts 1, 2, 3, 4 from a reset.
    assert batches[0]["next", "observation"][:, :5, 0].tolist() == [[1.0, 2.0, 3.0, 4.0, 1.0]] * 2
    ids = torch.cat([traj_ids(batch) for batch in batches], dim=-1)  # [2, 30]
    done = torch.cat([batch["next", "done"][..., 0] for batch in batches], dim=-1)
    assert_ids_follow_done_flags(ids, done)
    assert (ids % 2 == torch.tensor([[0], [1]])).all(), "actor i draws ids i + 2k"
    assert not set(ids[0].tolist()) & set(ids[1].tolist())


def test_async_yields_each_actors_batches_as_they_come_with_its_id() -> None:
    with RayCollector(
        counting_env(3),
        num_collectors=2,
        frames_per_batch=10,
        total_frames=60,
        sync=False,
        track_worker_id=True,
    ) as collector:
        assert collector.frames_per_batch == 10
        assert len(collector) == 6
        batches = list(collector)
        assert collector.frames == 60
    assert len(batches) == 6
    by_actor: dict[int, list[Any]] = {}
    for batch in batches:
        assert batch.batch_size == torch.Size([10])
        assert batch.names == ["time"]
        actor = batch[keys.WORKER_ID]
        assert (actor == actor[0]).all()
        by_actor.setdefault(int(actor[0]), []).append(batch)
    assert sorted(by_actor) == [0, 1]
    seen: set[int] = set()
    for actor, own in by_actor.items():
        ids = torch.cat([traj_ids(batch) for batch in own])  # its batches, in order
        done = torch.cat([batch["next", "done"][..., 0] for batch in own])
        assert_ids_follow_done_flags(ids, done)
        assert (ids % 2 == actor).all()
        assert not seen & set(ids.tolist())
        seen |= set(ids.tolist())


def test_two_actors_give_the_data_of_two_single_collectors_with_the_same_seeds() -> None:
    policy = greedy_module(seed=3)  # deterministic
    with RayCollector(
        "CartPole-v1", policy, num_collectors=2, frames_per_batch=80, total_frames=160
    ) as collector:
        collector.set_seed(11)
        remote = list(collector)
    singles = [Collector("CartPole-v1", policy, frames_per_batch=40) for _ in range(2)]
    seed = 11
    for single in singles:
        seed = single.set_seed(seed)
    for batch in remote:
        for actor, single in enumerate(singles):
            expected, row = single.next(), batch[actor]
            for key in expected.keys(include_nested=True, leaves_only=True):
                if key == keys.TRAJ_IDS:
                    assert torch.equal(row[key], expected[key] * 2 + actor)
                else:
                    torch.testing.assert_close(row[key], expected[key], msg=str(key))
    for single in singles:
        single.shutdown()


# --- options -------------------------------------------------------------------------------------


def test_collector_options_reach_every_actor_and_postprocessing_runs_here() -> None:
    shapes = []

    def record(batch: Any) -> Any:
        shapes.append(tuple(batch.batch_size))
        return batch

    with RayCollector(
        counting_env(4),
        num_collectors=2,
        frames_per_batch=24,
        total_frames=24,
        max_frames_per_traj=2,
        track_policy_version=True,
        split_trajs=True,
        postproc=record,
    ) as collector:
        (batch,) = list(collector)
    # Two steps per trajectory at most: 12 frames in 6 trajectories per actor, split here.
    assert shapes == [(12, 2)]
    assert batch[keys.MASK].all()
    assert (batch["next", "truncated"][:, 1] | batch["next", "terminated"][:, 1]).all()
    assert (batch["next", keys.POLICY_VERSION] == 0).all()


def test_each_actor_takes_its_own_collector_kwargs_and_remote_config() -> None:
    with RayCollector(
        CountingEnv,
        num_collectors=2,
        frames_per_batch=12,
        total_frames=12,
        collector_kwargs=[
            {"create_env_kwargs": {"episode_length": 3}},
            {"create_env_kwargs": {"episode_length": 5}},
        ],
        remote_configs=[{"num_cpus": 0.5}, {"num_cpus": 1, "memory": 200 * 1024**2}],
        init_random_frames=12,
    ) as collector:
        (batch,) = list(collector)
        stats = collector.stats()
        both = collector.stats(workers="both")
        with pytest.raises(ValueError, match="workers must be one of"):
            collector.stats(workers="all")
    counts = batch["next", "observation"][..., 0].tolist()
    assert counts == [[1.0, 2.0, 3.0, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0, 5.0, 1.0]]
    assert [actor["collector"]["frames"] for actor in stats["collectors"]] == [6, 6]
    # TorchRL's counts and flat per-worker view
    assert (stats["workers"], stats["workers_alive"], stats["worker_frames"]) == (2, 2, 12)
    assert [both[f"worker_{index}/frames"] for index in range(2)] == [6, 6]
    assert both["frames"] == 12


def test_an_actor_asking_for_more_than_the_cluster_has_is_named_in_time() -> None:
    with pytest.raises(RuntimeError, match=r"collector actor 0 failed: ready\(\) did not answer"):
        RayCollector(
            counting_env(),
            num_collectors=1,
            frames_per_batch=8,
            remote_configs={"num_cpus": 64},
            startup_timeout=3,
        )
    assert ray.is_initialized()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_collectors": 0}, ValueError, r"num_collectors=0 must be at least 1"),
        ({"num_collectors": None}, ValueError, r"num_collectors is needed"),
        ({"frames_per_batch": 0}, ValueError, r"frames_per_batch=0 must be a positive"),
        ({"frames_per_batch": [4, 4]}, TypeError, r"frames_per_batch must be an int"),
        ({"max_frames_per_trj": 3}, TypeError, r"Did you mean 'max_frames_per_traj'"),
        ({"collector_class": "multi"}, ValueError, r"collector_class='multi' is no collector"),
        ({"collector_class": print}, TypeError, r"is not a collector class"),
        (
            {"remote_configs": {"num_cpu": 1}},
            ValueError,
            r"remote_configs\[0\]: Invalid option keyword num_cpu for actors",
        ),
        (
            {"remote_configs": {"num_cpus": -1}},
            ValueError,
            r"remote_configs\[0\]: The quantity of resource num_cpus cannot be negative",
        ),
        (
            {"remote_configs": {"max_restarts": 3}},
            ValueError,
            r"has 'max_restarts': RayCollector sets it \(set by restart_dead_collectors\)",
        ),
        ({"remote_configs": [{}, {}, {}]}, TypeError, r"or a list of 2 dicts \(one per actor\)"),
        (
            {"ray_init_config": {"num_cpu": 2}},
            TypeError,
            r"ray_init_config has 'num_cpu', .* Did you mean 'num_cpus'\?",
        ),
        ({"replay_buffer": ReplayBuffer()}, TypeError, r"replay_buffer must be served by Ray"),
        (
            {
                "policy": greedy_module(),
                "weight_sync_schemes": {"policy": SharedMemWeightSyncScheme()},
            },
            TypeError,
            r"RayCollector sends weights through Ray's object store",
        ),
        ({"max_weight_update_interval": -2}, ValueError, r"must be -1 \(no forced update\)"),
        ({"worker_timeout": 0}, ValueError, r"worker_timeout=0 must be a positive number"),
        ({"sync": "yes"}, TypeError, r"sync must be True or False; got 'yes'"),
        (
            {"max_frames_per_traj": 2, "collector_kwargs": {"max_frames_per_traj": 3}},
            ValueError,
            r"\['max_frames_per_traj'\] given both",
        ),
        (
            {"policy": greedy_module(), "policy_factory": greedy_module},
            ValueError,
            r"pass policy or policy_factory, not both",
        ),
    ],
)
def test_bad_arguments_are_named_before_any_actor_starts(
    kwargs: dict[str, Any], error: type, match: str
) -> None:
    kwargs = {"num_collectors": 2, "frames_per_batch": 8, **kwargs}
    holders = RayLease._holders
    with pytest.raises(error, match=match):
        RayCollector(counting_env(), **kwargs)
    assert RayLease._holders == holders, "refused before Ray was asked for anything"


# --- state and control ---------------------------------------------------------------------------


def test_stats_state_dict_seeds_and_reset() -> None:
    with RayCollector(
        counting_env(4), num_collectors=2, frames_per_batch=12, total_frames=48
    ) as collector:
        assert collector.set_seed(7) != 7
        first = collector.next()
        stats = collector.stats()
        state = collector.state_dict()
    assert (stats["frames"], stats["batches"], stats["completed"]) == (12, 1, False)
    assert [actor["frames"] for actor in stats["collectors"]] == [6, 6]
    node = ray.get_runtime_context().get_node_id()
    assert all(actor["node_id"] == node and actor["restarts"] == 0 for actor in stats["collectors"])
    assert stats["episodes"] == 2  # one finished episode per actor
    with RayCollector(
        counting_env(4), num_collectors=2, frames_per_batch=12, total_frames=48
    ) as resumed:
        with pytest.raises(ValueError, match=r"the state holds 1 collectors; this collector has 2"):
            resumed.load_state_dict({**state, "collectors": state["collectors"][:1]})
        resumed.load_state_dict(state)
        assert resumed.frames == 12
        second = resumed.next()
        resumed.reset()
        third = resumed.next()
        later = list(resumed)
        assert resumed.frames == 48
    assert len(later) == 1
    used = set(traj_ids(first).flatten().tolist())
    assert not used & set(traj_ids(second).flatten().tolist()), "ids go on after a resume"
    assert third["observation"][:, 0, 0].tolist() == [0.0, 0.0], "reset: new trajectories"
    assert not set(traj_ids(second).flatten().tolist()) & set(traj_ids(third).flatten().tolist())


# --- who starts and stops Ray --------------------------------------------------------------------


def run_python(script: str, timeout: float = RAY_TEST_TIMEOUT - 60, fresh: bool = False) -> str:
    """Run `script` as `python <its file>` in a child of the script zygote (torch and rlcollect
    imported once: tests/examples/script_runner.py), or in a fresh interpreter (`fresh`: for a
    script that must import rlcollect itself); a cluster it starts runs its workers at nice 0
    (`RAY_worker_niceness`), as the test run's does (tests/ray_session.py)."""
    env = {**os.environ, **SUBPROCESS_ENV}
    with tempfile.TemporaryDirectory(prefix="ray-script-") as directory:
        path = Path(directory) / "script.py"
        path.write_text(textwrap.dedent(script))
        if fresh:
            done = subprocess.run(
                [sys.executable, str(path)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
            )
        else:
            done = zygote().run([str(path)], env, timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_process_that_joins_a_running_cluster_leaves_it_at_shutdown(ray_cluster: str) -> None:
    output = run_python(
        f"""
        import functools, ray
        from rlcollect.collectors import RayCollector
        from rlcollect.testing import CountingEnv

        collector = RayCollector(
            functools.partial(CountingEnv, episode_length=4),
            num_collectors=1,
            frames_per_batch=8,
            total_frames=8,
            ray_init_config={{"address": {ray_cluster!r}}},
            remote_configs={{"num_cpus": 0}},
        )
        joined = ray.is_initialized()
        (batch,) = list(collector)
        collector.shutdown()
        print("result", joined, ray.is_initialized(), tuple(batch.batch_size))
        """
    )
    assert "result True False (1, 8)" in output
    assert ray.is_initialized(), "the cluster it joined still runs"


@pytest.mark.slow
def test_without_ray_a_local_cluster_is_started_and_stopped_by_the_last_user() -> None:
    output = run_python(
        """
        import ray
        from rlcollect.collectors import RayCollector
        from rlcollect.replay import LazyTensorStorage, RayReplayBuffer

        config = {"num_cpus": 1, "include_dashboard": False, "object_store_memory": 10**8}
        rb = RayReplayBuffer(storage=LazyTensorStorage(100), ray_init_config=config)
        started = ray.is_initialized()
        collector = RayCollector(
            "CartPole-v1", num_collectors=1, frames_per_batch=8, total_frames=16, replay_buffer=rb
        )
        batches = list(collector)  # the actor writes the buffer: None comes back
        collector.shutdown()
        kept = ray.is_initialized()  # the buffer still uses it
        frames = rb.write_count
        rb.close()
        print("result", started, kept, ray.is_initialized(), batches, frames)
        """
    )
    assert "result True True False [None, None] 16" in output


def test_rlcollect_imports_without_ray_and_names_the_extra() -> None:
    output = run_python(
        """
        import sys
        sys.modules["ray"] = None  # as if Ray were not installed
        import rlcollect
        from rlcollect import RayCollector, RayReplayBuffer
        for build in (
            lambda: RayCollector("CartPole-v1", num_collectors=1, frames_per_batch=8),
            lambda: RayReplayBuffer(),
        ):
            try:
                build()
            except ImportError as err:
                print("refused:", err)
        """,
        fresh=True,
    )
    assert output.count("pip install 'rlcollect[ray]'") == 2, output
    assert "RayCollector needs Ray" in output
    assert "RayReplayBuffer needs Ray" in output


def test_remote_configs_are_rays_to_judge() -> None:
    """Any option Ray's actors take passes (no list of our own), checked by Ray itself
    before anything starts; only what RayCollector sets itself is refused."""
    from rlcollect.collectors.ray.options import check_remote_configs

    holders = RayLease._holders
    configs = check_remote_configs(
        [{"num_cpus": 1, "object_store_memory": 10**8}, {"lifetime": None, "num_gpus": 0}], 2
    )
    assert configs[0]["object_store_memory"] == 10**8
    assert configs[1] == {"lifetime": None, "num_gpus": 0}
    assert RayLease._holders == holders


def test_ray_init_config_takes_rays_hidden_options() -> None:
    """`_system_config` and Ray's other `_` options (read from ray.init's **kwargs) pass;
    a misspelt public one is still refused with the close match."""
    from rlcollect.runtime.ray_lease import check_init_config

    config = {"num_cpus": 2, "_system_config": {"worker_niceness": 0}, "_temp_dir": "/tmp/r"}
    assert check_init_config(config) == config
    with pytest.raises(TypeError, match=r"'num_cpu', .* Did you mean 'num_cpus'\?"):
        check_init_config({"num_cpu": 2})


def test_workers_of_the_test_run_cluster_run_at_the_tests_priority() -> None:
    """Ray's default puts its workers at nice 15, where on a busy machine building an actor took
    minutes (tests/ray_session.py); the run's cluster starts them at the tests' own."""

    @ray.remote(num_cpus=0)
    def niceness() -> int:
        return os.nice(0)

    assert ray.get(niceness.remote(), timeout=240) == os.nice(0)


def test_workers_of_the_test_run_cluster_are_forked_from_the_preloaded_zygote() -> None:
    """The session cluster's workers come from tests/ray_zygote.py (torch imported once, not
    per actor); a launcher that cannot reach the zygote would silently start fresh ones."""

    @ray.remote(num_cpus=0)
    def where() -> tuple[str, bool]:
        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ")
        return parent.decode(), "torch" in sys.modules

    parent, torch_imported = ray.get(where.remote(), timeout=240)
    assert "tests.ray_zygote serve" in parent
    assert torch_imported

"""MultiSyncCollector / MultiAsyncCollector: shapes, frame counts, ids, parity, state."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from rlcollect import keys
from rlcollect.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
from rlcollect.envs import SerialEnv
from rlcollect.testing import CountingEnv
from tests.collectors.policies import greedy_module

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]


def counting_env(episode_length: int = 4) -> CountingEnv:
    return CountingEnv(episode_length=episode_length)


def batched_counting_env() -> CountingEnv:
    return CountingEnv(episode_length=(3, 5), batch_size=(2,))


def traj_ids(batch: torch.Tensor) -> torch.Tensor:
    return batch[keys.TRAJ_IDS]


# --- shapes and frame counts ----------------------------------------------------------------------


def test_sync_stack_yields_worker_rows_named_time() -> None:
    with MultiSyncCollector(
        batched_counting_env, num_workers=3, frames_per_batch=24, total_frames=48
    ) as collector:
        batches = list(collector)
        assert len(collector) == 2
        assert collector.frames == 48
    assert len(batches) == 2
    for batch in batches:
        assert batch.batch_size == torch.Size([3, 2, 4])
        assert batch.names == [None, None, "time"]
        assert batch["next", "observation"].shape == (3, 2, 4, 1)
    # Row i is worker i's own run: its first batch counts 1, 2, 3, ... from a reset.
    first = batches[0]["next", "observation"][..., 0]
    assert first[:, 0].tolist() == [[1.0, 2.0, 3.0, 1.0]] * 3


@pytest.mark.parametrize(("cat_results", "shape"), [(0, (4, 5)), (-1, (2, 20))])
def test_sync_concatenates_along_the_dim_asked(cat_results: int, shape: tuple[int, ...]) -> None:
    env_makers = [batched_counting_env, batched_counting_env]
    frames = 10 if cat_results == 0 else 20
    with MultiSyncCollector(
        env_makers,
        frames_per_batch=[frames, frames],
        total_frames=frames * 2,
        cat_results=cat_results,
    ) as collector:
        (batch,) = list(collector)
    assert batch.batch_size == torch.Size(shape)
    assert batch.names[-1] == "time"


def test_per_worker_frames_need_a_cat_along_time() -> None:
    with pytest.raises(ValueError, match=r"cat_results='stack' needs the same frames_per_batch"):
        MultiSyncCollector(counting_env, num_workers=2, frames_per_batch=[4, 6])
    with MultiSyncCollector(
        counting_env, num_workers=2, frames_per_batch=[4, 6], total_frames=20, cat_results=-1
    ) as collector:
        assert collector.frames_per_batch == 10
        batches = list(collector)
    assert [batch.batch_size for batch in batches] == [torch.Size([10])] * 2


def test_async_yields_each_workers_batches_in_order_with_its_id() -> None:
    with MultiAsyncCollector(
        [counting_env, functools.partial(counting_env, 6)],
        frames_per_batch=[5, 7],  # TorchRL's per-worker list: every batch holds the sum
        total_frames=60,
        track_worker_id=True,
    ) as collector:
        assert collector.frames_per_batch == 12
        assert len(collector) == 5
        batches = list(collector)
        assert collector.frames >= 60
    by_worker: dict[int, list] = {0: [], 1: []}
    for batch in batches:
        worker = batch[keys.WORKER_ID]
        assert (worker == worker[0]).all()
        by_worker[int(worker[0])].append(batch)
    assert {len(batch) for batch in batches} == {12}
    assert by_worker[0]
    assert by_worker[1]
    assert sum(len(batch) for batch in batches) == collector.frames
    # A worker's trajectories continue across its batches: observations count on.
    observations = torch.cat([batch["next", "observation"] for batch in by_worker[0]])[:, 0]
    expected = torch.arange(len(observations)) % 4 + 1
    assert observations.tolist() == expected.float().tolist()


def test_nested_collectors_stack_their_workers() -> None:
    inner = functools.partial(MultiSyncCollector, num_workers=2)
    with MultiSyncCollector(
        counting_env, num_workers=2, frames_per_batch=16, total_frames=32, collector_class=inner
    ) as collector:
        batches = list(collector)
        pids = collector.process_ids()
    assert len(pids) == 6
    assert len(set(pids)) == 6
    for batch in batches:
        assert batch.batch_size == torch.Size([2, 2, 4])
        assert batch.names == [None, None, "time"]
    ids = torch.cat([traj_ids(batch).reshape(4, -1) for batch in batches], dim=1)
    rows = [set(row.tolist()) for row in ids]
    for i, row in enumerate(rows):
        for other in rows[i + 1 :]:
            assert not row & other, "two leaves handed out the same trajectory id"


def test_trajectory_ids_are_unique_across_workers_and_batches() -> None:
    with MultiSyncCollector(
        batched_counting_env, num_workers=3, frames_per_batch=60, total_frames=180
    ) as collector:
        batches = list(collector)
    ids = torch.cat([traj_ids(batch) for batch in batches], dim=-1)  # [3, 2, 30]
    starts = ids.clone()
    owners: dict[int, tuple[int, int]] = {}
    for worker in range(3):
        for env in range(2):
            for value in starts[worker, env].unique().tolist():
                assert owners.setdefault(value, (worker, env)) == (worker, env)
    # A new id exactly where the previous step was done.
    done = torch.cat([batch["next", "done"][..., 0] for batch in batches], dim=-1)
    changed = ids[..., 1:] != ids[..., :-1]
    assert torch.equal(changed, done[..., :-1])


# --- parity with single collectors ----------------------------------------------------------------


def test_sync_rows_equal_single_collectors_with_the_same_seeds() -> None:
    policy = greedy_module(seed=3)
    with MultiSyncCollector(
        "CartPole-v1", policy, num_workers=2, frames_per_batch=80, total_frames=160
    ) as collector:
        collector.set_seed(11)
        multi = list(collector)
    singles = [Collector("CartPole-v1", policy, frames_per_batch=40) for _ in range(2)]
    seed = 11
    for single in singles:
        seed = single.set_seed(seed)
    for batch in multi:
        for worker, single in enumerate(singles):
            expected = single.next()
            row = batch[worker]
            for key in expected.keys(include_nested=True, leaves_only=True):
                if key == keys.TRAJ_IDS:
                    assert torch.equal(row[key], expected[key] * 2 + worker)
                else:
                    torch.testing.assert_close(row[key], expected[key], msg=str(key))
    for single in singles:
        single.shutdown()


def test_the_same_seed_gives_the_same_batches() -> None:
    def run(seed: int) -> list:
        with MultiSyncCollector(
            "CartPole-v1", num_workers=2, frames_per_batch=40, total_frames=80
        ) as collector:
            collector.set_seed(seed)
            return list(collector)

    first, again, other = run(5), run(5), run(6)
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a["observation"], b["observation"])
        assert torch.equal(a["action"], b["action"])
    assert not torch.equal(first[0]["observation"], other[0]["observation"])
    assert not torch.equal(first[0]["observation"][0], first[0]["observation"][1])


# --- options --------------------------------------------------------------------------------------


def test_collector_options_reach_every_worker() -> None:
    with MultiSyncCollector(
        counting_env,
        num_workers=2,
        frames_per_batch=12,
        total_frames=24,
        max_frames_per_traj=2,
        track_policy_version=True,
        split_trajs=True,
    ) as collector:
        batch = collector.next()
    # Max two steps per trajectory: 12 frames in 6 trajectories of 2 steps per worker.
    assert batch.batch_size == torch.Size([6, 2])
    assert batch[keys.MASK].all()
    assert (batch["next", "truncated"][:, 1] | batch["next", "terminated"][:, 1]).all()
    assert (batch["next", keys.POLICY_VERSION] == 0).all()


def test_postproc_runs_in_the_parent_on_the_gathered_batch() -> None:
    shapes = []

    def record(batch):
        shapes.append(batch.batch_size)
        return batch

    with MultiSyncCollector(
        counting_env, num_workers=2, frames_per_batch=8, total_frames=8, postproc=record
    ) as collector:
        list(collector)
    assert shapes == [torch.Size([2, 4])]


def test_workers_run_batched_envs_with_per_worker_devices() -> None:
    with MultiSyncCollector(
        lambda: SerialEnv(2, counting_env),
        num_workers=2,
        frames_per_batch=8,
        total_frames=8,
        device=["cpu", "cpu"],
    ) as collector:
        (batch,) = list(collector)
    assert batch.batch_size == torch.Size([2, 2, 2])


def test_init_random_frames_are_shared_out() -> None:
    with MultiSyncCollector(
        "CartPole-v1",
        greedy_module(),
        num_workers=2,
        frames_per_batch=20,
        total_frames=60,
        init_random_frames=20,
    ) as collector:
        stats = collector.stats()
        batches = list(collector)
    assert stats["per_worker"][0]["collector"]["frames"] == 0
    assert len(batches) == 3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_workers": 0}, r"num_workers=0 must be at least 1"),
        ({}, r"num_workers is needed"),
        ({"num_workers": 2, "cat_results": 1}, r"cat_results=1 is not supported"),
        ({"num_workers": 2, "frames_per_batch": [4]}, r"got 1 values for num_workers=2"),
        ({"num_workers": 2, "max_frames_per_trj": 3}, r"Did you mean 'max_frames_per_traj'"),
        ({"num_workers": 2, "worker_timeout": 0}, r"worker_timeout=0 must be a positive"),
        ({"num_workers": 2, "device": ["cpu"]}, r"device is a list of 1 entries but num_workers=2"),
    ],
)
def test_bad_arguments_are_named_at_construction(kwargs: dict, match: str) -> None:
    kwargs.setdefault("frames_per_batch", 8)
    with pytest.raises((ValueError, TypeError), match=match):
        MultiSyncCollector(counting_env, **kwargs)


# --- state and control ----------------------------------------------------------------------------


def test_stats_count_frames_per_worker() -> None:
    with MultiSyncCollector(
        counting_env, num_workers=2, frames_per_batch=8, total_frames=16
    ) as collector:
        list(collector)
        stats = collector.stats()
    assert stats["frames"] == 16
    assert stats["batches"] == 2
    assert stats["completed"]
    assert [worker["frames"] for worker in stats["per_worker"]] == [8, 8]
    assert all(worker["alive"] and worker["restarts"] == 0 for worker in stats["per_worker"])
    assert stats["per_worker"][0]["collector"]["episodes"] == 2
    assert stats["per_worker"][0]["collector"]["mean_length_last_100"] == 4.0
    assert stats["mean_length_last_100"] == 4.0  # over the workers
    assert math.isnan(stats["weight_update_seconds"])  # no update yet


def test_state_dict_resumes_counts_and_trajectories() -> None:
    with MultiSyncCollector(
        counting_env, num_workers=2, frames_per_batch=6, total_frames=24
    ) as collector:
        first = collector.next()
        state = collector.state_dict()
    with MultiSyncCollector(
        counting_env, num_workers=2, frames_per_batch=6, total_frames=24
    ) as resumed:
        resumed.load_state_dict(state)
        assert resumed.frames == 6
        later = list(resumed)
        assert resumed.frames == 24
    assert len(later) == 3
    used = set(traj_ids(first).flatten().tolist())
    assert not used & set(torch.cat([traj_ids(batch) for batch in later]).flatten().tolist())
    with (
        MultiSyncCollector(counting_env, num_workers=3, frames_per_batch=6) as other,
        pytest.raises(ValueError, match=r"the state holds 2 workers; this collector has 3"),
    ):
        other.load_state_dict(state)


def test_reset_starts_new_trajectories_in_every_worker() -> None:
    with MultiSyncCollector(counting_env, num_workers=2, frames_per_batch=6) as collector:
        first = collector.next()
        collector.reset()
        second = collector.next()
    assert second["observation"][:, 0, 0].tolist() == [0.0, 0.0]
    assert not set(traj_ids(first).flatten().tolist()) & set(traj_ids(second).flatten().tolist())


def test_a_shut_down_collector_refuses_work() -> None:
    collector = MultiSyncCollector(counting_env, num_workers=2, frames_per_batch=4)
    collector.shutdown()
    collector.shutdown()
    with pytest.raises(RuntimeError, match=r"shut down; build a new one"):
        collector.next()


def test_spawned_workers_collect_the_same_as_forkserver_ones() -> None:
    def run(method: str) -> torch.Tensor:
        with MultiSyncCollector(
            counting_env, num_workers=2, frames_per_batch=8, mp_start_method=method
        ) as collector:
            return collector.next()["next", "observation"]

    assert torch.equal(run("spawn"), run("forkserver"))


def test_rounded_frame_counts_warn_as_collector_does() -> None:
    with pytest.warns(UserWarning, match=r"frames_per_batch=10 is not a multiple of num_workers=3"):
        collector = MultiSyncCollector(counting_env, num_workers=3, frames_per_batch=10)
    assert collector.frames_per_batch == 12
    collector.shutdown()
    with pytest.warns(UserWarning, match=r"total_frames=25 is not a multiple .* total_frames=30"):
        collector = MultiSyncCollector(
            counting_env, num_workers=2, frames_per_batch=10, total_frames=25
        )
    assert len(collector) == 3
    collector.shutdown()

"""What TorchRL's own collector test-file checks of `MultiSyncCollector` /
`MultiAsyncCollector`, guarded here (CI cannot reach that file). TorchRL's own multi-process
collectors and shared replay buffers keep semaphores for the life of this process, which the
no-leftover check would count, so this pins TorchRL's answers (its test-file's) with our own
buffer instead of running TorchRL's side by side."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torchrl.envs import EnvCreator
from torchrl.envs import GymEnv as TorchRLGymEnv

from rlcollect import LazyTensorStorage, MultiAsyncCollector, MultiSyncCollector, ReplayBuffer


def cartpole() -> TorchRLGymEnv:
    return TorchRLGymEnv("CartPole-v1")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("collector_class", [MultiSyncCollector, MultiAsyncCollector])
def test_remote_helpers_state_layout_and_env_creators(
    collector_class: type, no_leftover_children: None
) -> None:
    """`get_distant_attr` / `map_fn` ask every worker (TorchRL's messages for a wrong count),
    `replay_buffer` paths resolve in the workers, `state_dict()` has TorchRL's "worker0", ...
    entries, and TorchRL's `EnvCreator` is taken as an env maker."""
    buffer = ReplayBuffer(storage=LazyTensorStorage(256), shared=True)
    maker = EnvCreator(cartpole)
    collector = collector_class(
        [maker, maker], None, frames_per_batch=16, total_frames=32, replay_buffer=buffer
    )
    try:
        assert collector.get_distant_attr("worker_idx") == [0, 1]
        assert collector.map_fn("get_distant_attr", list_of_args=[("worker_idx",)] * 2) == [0, 1]
        with pytest.raises(ValueError, match="Expected 2 argument entries, got 1"):
            collector.map_fn("get_distant_attr", list_of_args=[("worker_idx",)])
        list(collector)
        assert collector.map_fn("replay_buffer.__len__") == [len(buffer)] * 2
        assert collector.get_distant_attr("replay_buffer.write_count") == [buffer.write_count] * 2
        assert len(buffer) == 32
        state = collector.state_dict()
        assert [state[f"worker{index}"] for index in range(2)] == state["workers"]
        assert "policy_state_dict" in state["worker0"]
    finally:
        collector.shutdown()
        buffer.close()


@pytest.mark.timeout(300)
def test_collect_hooks_set_on_the_parent_run_in_every_worker(
    tmp_path: Path, no_leftover_children: None
) -> None:
    """TorchRL's `collector.pre_collect_hook = ...` / `post_collect_hook = ...` on a
    multi-process collector: each worker runs them around its own batches (closures travel)."""

    def pre_hook() -> None:
        (tmp_path / f"pre-{os.getpid()}").touch()

    def post_hook(batch: Any) -> None:
        (tmp_path / f"post-{os.getpid()}-{batch.numel()}").touch()

    collector = MultiSyncCollector([cartpole, cartpole], None, frames_per_batch=16, total_frames=32)
    try:
        assert collector.pre_collect_hook is None
        collector.pre_collect_hook = pre_hook
        collector.post_collect_hook = post_hook
        assert collector.pre_collect_hook is pre_hook
        pids = sorted(worker["pid"] for worker in collector.stats()["per_worker"])
        list(collector)
        with pytest.raises(TypeError, match=r"post_collect_hook must be a callable or None"):
            collector.post_collect_hook = "print"
    finally:
        collector.shutdown()
    written = sorted(path.name for path in tmp_path.iterdir())
    assert written == sorted([f"pre-{pid}" for pid in pids] + [f"post-{pid}-8" for pid in pids])
    assert os.getpid() not in pids


@pytest.mark.timeout(300)
@pytest.mark.parametrize("collector_class", [MultiSyncCollector, MultiAsyncCollector])
def test_stats_counts_workers_and_flattens_them_in_torchrl_views(
    collector_class: type, no_leftover_children: None
) -> None:
    """TorchRL's `stats()` of a multi-process collector (its test-file's
    `test_multiprocess_collector_stats`): `"workers"` / `"workers_alive"` are counts, and
    `workers="per_worker"` / `"both"` add each worker's scalars as `"worker_<i>/<name>"`; our
    per-worker dicts stay under `"per_worker"`, also after `async_shutdown()`."""
    collector = collector_class([cartpole, cartpole], None, frames_per_batch=16, total_frames=32)
    try:
        with pytest.raises(ValueError, match=r"workers must be one of .*got 'bogus'"):
            collector.stats(workers="bogus")
        next(iter(collector))
        stats = collector.stats()
        assert (stats["workers"], stats["workers_alive"]) == (2, 2)
        assert stats["frames"] >= 16
        assert not any(name.startswith("worker_") for name in stats)
        pids = [worker["pid"] for worker in stats["per_worker"]]
        both = collector.stats(workers="both")
        assert both["frames"] == stats["frames"]
        assert [both[f"worker_{index}/pid"] for index in range(2)] == pids
        assert sum(both[f"worker_{index}/frames"] for index in range(2)) >= 16
        assert isinstance(both["worker_0/episodes"], int), "the worker's collector's own counts"
        assert isinstance(both["worker_0/alive"], bool)
        per_worker = collector.stats(workers="per_worker")
        assert "frames" not in per_worker
        assert "per_worker" not in per_worker
        assert per_worker["workers"] == 2
        assert set(per_worker) == {"workers", "workers_alive"} | {
            name for name in both if name.startswith("worker_")
        }
        collector.async_shutdown()  # keeps the final stats, in every view
        assert collector.stats(workers="both")["worker_1/pid"] == pids[1]
        assert collector.stats(workers="per_worker")["workers"] == 2
    finally:
        collector.shutdown()


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children")
@pytest.mark.parametrize("collector_class", [MultiSyncCollector, MultiAsyncCollector])
@pytest.mark.parametrize(
    ("options", "batch_device"),
    [
        ({}, None),
        ({"device": "cpu"}, torch.device("cpu")),
        ({"storing_device": ["cpu"] * 2}, torch.device("cpu")),
        ({"env_device": "cpu"}, None),
        ({"env_device": "cpu", "policy_device": "cpu"}, torch.device("cpu")),
    ],
)
def test_batches_carry_a_device_only_when_one_is_given(
    collector_class: type, options: dict[str, Any], batch_device: torch.device | None
) -> None:
    """Workers on an env with a device (ours, CPU): a batch carries `device` or
    `storing_device` when given and no device otherwise (TorchRL's MultiSyncCollector and
    MultiAsyncCollector answer None and cpu here, as its `test_output_device` checks for its
    `Collector`)."""
    with collector_class(
        ["CartPole-v1"] * 2, None, frames_per_batch=8, total_frames=16, **options
    ) as collector:
        assert [batch.device for batch in collector] == [batch_device] * 2

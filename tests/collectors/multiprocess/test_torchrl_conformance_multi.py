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
        pids = sorted(worker["pid"] for worker in collector.stats()["workers"])
        list(collector)
        with pytest.raises(TypeError, match=r"post_collect_hook must be a callable or None"):
            collector.post_collect_hook = "print"
    finally:
        collector.shutdown()
    written = sorted(path.name for path in tmp_path.iterdir())
    assert written == sorted([f"pre-{pid}" for pid in pids] + [f"post-{pid}-8" for pid in pids])
    assert os.getpid() not in pids

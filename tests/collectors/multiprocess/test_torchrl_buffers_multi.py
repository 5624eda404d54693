"""TorchRL's replay buffers (lazy storages included) filled by our multi-process collectors'
workers as TorchRL's own multi-process collectors fill them, side by side on TorchRL's
CartPole with a TorchRL policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import rlcollect.collectors
from tests.collectors.multiprocess.torchrl_buffer_side import fill, run_torchrl_fills
from tests.conftest import processes_gone

pytest.importorskip("torchrl.collectors")

# Not the shared-memory leak checks of tests/conftest.py: a shared TorchRL buffer keeps
# what it allocated (its locks' named semaphores, the multiprocessing heap of its counters) for
# the life of the process. The workers are checked to be gone instead.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BUILDERS = ("MultiSyncCollector", "MultiAsyncCollector")


@pytest.fixture(scope="module")
def torchrl_fills(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """What TorchRL's collectors leave in a lazy `LazyTensorStorage` buffer (one process)."""
    directory = tmp_path_factory.mktemp("torchrl")
    described = run_torchrl_fills([(name, "tensor") for name in BUILDERS], directory)
    return dict(zip(BUILDERS, described, strict=True))


# The cases share one pytest-xdist worker, so that torchrl_fills (TorchRL's run) is made once.
@pytest.mark.xdist_group("torchrl_fills")
@pytest.mark.parametrize(
    ("builder", "kind"),
    [
        ("MultiSyncCollector", "tensor"),
        ("MultiSyncCollector", "initialised"),
        ("MultiAsyncCollector", "memmap"),
    ],
)
def test_workers_fill_a_torchrl_buffer_as_torchrl_does(
    builder: str, kind: str, torchrl_fills: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    theirs = torchrl_fills[builder]
    ours = fill(rlcollect.collectors, builder, kind, tmp_path)
    # Iteration yields None once per batch; every frame is counted and stored once.
    assert ours["yielded_none"] == theirs["yielded_none"] == [True] * 3
    assert ours["frames"] == theirs["frames"] == 120
    assert ours["len"] == ours["write_count"] == 120
    if builder == "MultiAsyncCollector":
        # TorchRL's asynchronous workers run on while the last batch is handed over, so one of
        # them sometimes writes a further batch of 40 before shutdown (seen: 160 stored in
        # CI); ours stop writing once total_frames are in.
        assert theirs["len"] == theirs["write_count"] >= 120
        assert theirs["len"] % 40 == 0
    else:
        assert theirs["len"] == theirs["write_count"] == 120
    # The same entries, with the same per-frame shapes and dtypes.
    assert ours["keys"] == theirs["keys"]
    assert ours["shapes"] == theirs["shapes"]
    assert ours["dtypes"] == theirs["dtypes"]
    # Each trajectory's stored steps follow one another (TorchRL's own run is not asked to:
    # its trajectory ids are not always unique over workers).
    assert ours["breaks"] == 0
    assert ours["trajectories"] >= 2
    assert processes_gone(ours["pids"], 10)


def short_cartpole() -> Any:
    """TorchRL's CartPole, its episodes cut at 5 steps (many whole episodes per batch)."""
    from torchrl.envs import GymEnv, StepCounter, TransformedEnv

    return TransformedEnv(GymEnv("CartPole-v1"), StepCounter(5))


def two_short_cartpoles() -> Any:
    from torchrl.envs import SerialEnv

    return SerialEnv(2, short_cartpole)


def fill_with_two_workers(builder: str, env_maker: Any, buffer: Any, **options: Any) -> list[int]:
    """Have `builder` (two workers of `env_maker`, random actions) fill `buffer` until its
    `total_frames`, iteration yielding None; returns the workers' pids."""
    collector = getattr(rlcollect.collectors, builder)(
        [env_maker, env_maker], None, replay_buffer=buffer, **options
    )
    try:
        pids = [worker["pid"] for worker in collector.stats()["per_worker"]]
        assert all(batch is None for batch in collector)
    finally:
        collector.shutdown()
    return pids


@pytest.mark.parametrize(
    ("builder", "env_maker"),
    [("MultiSyncCollector", short_cartpole), ("MultiAsyncCollector", two_short_cartpoles)],
)
def test_workers_write_whole_episodes_flat_to_a_lazy_torchrl_buffer(
    builder: str, env_maker: Any
) -> None:
    """TorchRL's `trajs_per_batch` with its replay buffer: each worker writes its whole
    episodes as one flat run of steps (a 1-D storage whatever the env's batch shape), never
    a partial one; the lazy storage is laid out flat before the workers start."""
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    buffer = ReplayBuffer(storage=LazyTensorStorage(1000), shared=True)
    pids = fill_with_two_workers(
        builder, env_maker, buffer, frames_per_batch=40, total_frames=120, trajs_per_batch=2
    )
    stored = buffer.storage[: len(buffer)]
    assert stored.batch_dims == 1
    assert len(buffer) >= 120
    ids, done = stored["collector", "traj_ids"], stored["next", "done"].squeeze(-1)
    for trajectory in ids.unique():
        steps = (ids == trajectory).nonzero().squeeze(-1)
        assert bool(done[steps[-1]]), f"trajectory {int(trajectory)} stored without its end"
        assert int(stored["next", "step_count"][steps[-1]]) == len(steps) <= 5
    assert processes_gone(pids, 10)


@pytest.mark.parametrize("builder", ["MultiSyncCollector", "MultiAsyncCollector"])
def test_workers_add_step_by_step_to_a_two_dim_torchrl_buffer(builder: str) -> None:
    """TorchRL's `extend_buffer=False` in workers whose env is batched, into a 2-dim lazy
    storage: each step is one `add` of the env batch, the storage laid out that way first."""
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    buffer = ReplayBuffer(storage=LazyTensorStorage(512, ndim=2))
    pids = fill_with_two_workers(
        builder,
        two_short_cartpoles,
        buffer,
        frames_per_batch=32,
        total_frames=128,
        extend_buffer=False,
    )
    assert len(buffer) == 128  # 64 steps of 2 envs
    assert buffer[:].batch_size == (2, 64)  # TorchRL reads a 2-dim storage back env-major
    assert buffer[:]["step_count"].min() >= 0
    assert processes_gone(pids, 10)

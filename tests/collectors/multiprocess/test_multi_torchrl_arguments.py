"""TorchRL's constructor arguments of the multi-process collectors: preemptive_threshold,
init_fn, worker_idx, policy with policy_factory, MultiAsync's cat_results, weight_updater,
options passed on to the workers' collectors, and float done flags in a worker."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule

from rlcollect import keys
from rlcollect.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
from rlcollect.testing import CountingEnv
from tests.collectors.multiprocess.slow_envs import slow_counting_env
from tests.collectors.policies import BiasPolicy

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]
PENDULUM = "Pendulum-v1"


def counting_env() -> CountingEnv:
    return CountingEnv(episode_length=4)


def bias_module(bias: float) -> TensorDictModule:
    return TensorDictModule(BiasPolicy(bias), in_keys=["observation"], out_keys=["action"])


# --- preemptive_threshold -------------------------------------------------------------------------


def test_preemption_cuts_the_slow_workers_batch_and_masks_it() -> None:
    with MultiSyncCollector(
        [counting_env, slow_counting_env],
        frames_per_batch=200,
        total_frames=400,
        preemptive_threshold=0.5,
    ) as collector:
        first = collector.next()
        frames_after_one = collector.frames
        second = collector.next()
    for batch in (first, second):
        mask = batch[keys.MASK]
        assert batch.batch_size == (2, 100)
        assert bool(mask[0].all())  # the fast worker finished its batch
        assert 0 < int(mask[1].sum()) < 100  # the slow one was cut short after a step or more
        assert torch.equal(mask, batch[keys.TRAJ_IDS] != -1)
        collected = int(mask[1].sum())
        assert bool(mask[1, :collected].all())
    assert frames_after_one == int(first[keys.MASK].sum())
    # The cut worker went on from where it stopped: its counts continue.
    last = first["next", "observation"][1, int(first[keys.MASK][1].sum()) - 1, 0]
    assert second["observation"][1, 0, 0] == (0.0 if last == 4 else last)


def test_preemption_with_cat_results_drops_the_steps_not_collected() -> None:
    with MultiSyncCollector(
        [counting_env, slow_counting_env],
        frames_per_batch=200,
        total_frames=200,
        preemptive_threshold=0.5,
        cat_results=-1,
    ) as collector:
        batch = collector.next()
        frames = collector.frames
    assert 100 < batch.numel() < 200
    assert keys.MASK not in batch.keys(include_nested=True)
    assert bool((batch[keys.TRAJ_IDS] != -1).all())
    assert frames == batch.numel()


@pytest.mark.parametrize("threshold", [None, 1.0])
def test_no_preemption_by_default_or_at_one(threshold: float | None) -> None:
    with MultiSyncCollector(
        [counting_env, slow_counting_env],
        frames_per_batch=20,
        total_frames=20,
        preemptive_threshold=threshold,
    ) as collector:
        batch = collector.next()
        assert collector.interruptor is None
        assert collector.preemptive_threshold == threshold  # as given (TorchRL's attribute)
    assert keys.MASK not in batch.keys(include_nested=True)
    assert bool((batch[keys.TRAJ_IDS] >= 0).all())


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (1.5, ValueError, r"preemptive_threshold=1.5 must be between 0.0 and 1.0"),
        ("half", TypeError, r"preemptive_threshold must be a number .* got 'half'"),
    ],
)
def test_bad_preemptive_thresholds_are_refused(value: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        MultiSyncCollector(
            counting_env, num_workers=1, frames_per_batch=8, preemptive_threshold=value
        )


def test_preemption_with_whole_episodes_is_refused() -> None:
    with pytest.raises(ValueError, match=r"preemptive_threshold=0.5 cannot be used with batches"):
        MultiSyncCollector(
            counting_env,
            num_workers=2,
            frames_per_batch=8,
            preemptive_threshold=0.5,
            trajs_per_batch=2,
        )


# --- init_fn, worker_idx --------------------------------------------------------------------------


def write_pid(folder: Path) -> None:
    (folder / str(os.getpid())).write_text("")


class IndexedCollector(Collector):
    """Writes the `worker_idx` its parent gave it into every batch."""

    def next(self) -> TensorDictBase | None:
        batch = super().next()
        assert batch is not None
        batch.set("worker_index", torch.full(batch.batch_size, self.worker_idx))
        return batch


def test_init_fn_runs_in_every_worker_and_workers_know_their_index(tmp_path: Path) -> None:
    with MultiSyncCollector(
        counting_env,
        num_workers=2,
        frames_per_batch=8,
        total_frames=8,
        init_fn=functools.partial(write_pid, tmp_path),
        collector_class=IndexedCollector,
        worker_idx=5,
    ) as collector:
        batch = collector.next()
        pids = collector.pool.pids
        assert collector.worker_idx == 5
    assert sorted(int(name.name) for name in tmp_path.iterdir()) == sorted(pids)
    assert batch["worker_index"][:, 0].tolist() == [0, 1]


def test_a_bad_init_fn_is_refused() -> None:
    with pytest.raises(TypeError, match=r"init_fn must be a callable taking no argument"):
        MultiSyncCollector(counting_env, num_workers=1, frames_per_batch=8, init_fn=3)


# --- policy with policy_factory, weight_updater, cat_results --------------------------------------


def test_policy_with_a_factory_workers_build_theirs_and_start_from_the_policys_weights() -> None:
    policy = bias_module(0.75)
    with MultiSyncCollector(
        PENDULUM,
        policy,
        num_workers=2,
        frames_per_batch=20,
        policy_factory=functools.partial(bias_module, -0.25),
    ) as collector:
        first = collector.next()
        with torch.no_grad():
            policy.module.bias.fill_(0.5)
        collector.update_policy_weights_()
        second = collector.next()
    assert torch.all(first["action"] == 0.75)
    assert torch.all(second["action"] == 0.5)


def per_worker_updater(server_weights: Any) -> Any:
    """A TorchRL legacy updater that reaches each worker through our public update path."""
    torchrl_collectors = pytest.importorskip("torchrl.collectors")

    class PerWorkerUpdater(torchrl_collectors.WeightUpdaterBase):
        def __init__(self) -> None:
            self.synced: list[int] = []

        def _get_server_weights(self) -> Any:
            return server_weights

        def _maybe_map_weights(self, weights: Any) -> Any:
            return weights

        def all_worker_ids(self) -> list[int]:
            return [0, 1]

        def _sync_weights_with_worker(self, worker_id: int, server_weights: Any) -> None:
            self.synced.append(worker_id)
            self.collector.update_policy_weights_(server_weights, worker_ids=worker_id)

    return PerWorkerUpdater()


def test_weight_updater_is_handed_every_update_and_reaches_workers_through_ours() -> None:
    trainer = bias_module(1.5)
    updater = per_worker_updater(TensorDict.from_module(trainer).data)
    with MultiSyncCollector(
        PENDULUM, bias_module(0.5), num_workers=2, frames_per_batch=20, weight_updater=updater
    ) as collector:
        assert collector.weight_updater is updater
        assert updater.collector is collector
        assert torch.all(collector.next()["action"] == 0.5)
        collector.update_policy_weights_()
        assert updater.synced == [0, 1]
        assert torch.all(collector.next()["action"] == 1.5)
        collector.update_policy_weights_({"module.bias": torch.tensor([-1.0])}, worker_ids=1)
        assert updater.synced == [0, 1, 1]
        batch = collector.next()
        assert torch.all(batch["action"][0] == 1.5)
        assert torch.all(batch["action"][1] == -1.0)
        with pytest.raises(ValueError, match=r"weight_updater pushes the policy's weights only"):
            collector.update_policy_weights_(weights_dict={"policy": trainer})
    with pytest.raises(TypeError, match=r"weight_updater must be a TorchRL WeightUpdaterBase"):
        MultiSyncCollector(counting_env, num_workers=1, frames_per_batch=8, weight_updater=42)


@pytest.mark.parametrize("cat_results", [None, "stack", 0, -1])
def test_async_accepts_cat_results_as_torchrl_does(cat_results: object) -> None:
    with MultiAsyncCollector(
        counting_env,
        num_workers=2,
        frames_per_batch=8,
        total_frames=16,
        cat_results=cat_results,
        preemptive_threshold=0.5,
    ) as collector:
        batches = list(collector)
    assert [batch.batch_size for batch in batches] == [torch.Size([8])] * 2


def test_sync_cat_results_none_is_stack() -> None:
    with MultiSyncCollector(
        counting_env, num_workers=2, frames_per_batch=8, total_frames=8, cat_results=None
    ) as collector:
        assert collector.next().batch_size == (2, 4)


# --- options the workers' collectors take ---------------------------------------------------------


def test_workers_compile_the_policy_and_accept_torchrls_other_options() -> None:
    with MultiSyncCollector(
        PENDULUM,
        bias_module(0.5),
        num_workers=2,
        frames_per_batch=20,
        total_frames=20,
        compile_policy={"backend": "eager"},
        no_cuda_sync=True,
        use_buffers=False,
        local_init_rb=True,
        num_threads=1,
        num_sub_threads=1,
        update_at_each_batch=True,
    ) as collector:
        batch = collector.next()
    assert torch.all(batch["action"] == 0.5)


def test_float_done_flags_in_a_worker() -> None:
    from tests.collectors.single.float_done_env import FloatDoneEnv

    with MultiSyncCollector(
        FloatDoneEnv, num_workers=2, frames_per_batch=16, total_frames=16
    ) as collector:
        batch = collector.next()
    assert batch["next", "done"].dtype == torch.float32
    assert batch["next", "observation"][0, :, 0].tolist() == [1, 2, 3, 1, 2, 3, 1, 2]
    assert batch[keys.TRAJ_IDS][0].tolist() == [0, 0, 0, 2, 2, 2, 4, 4]


# --- MAX_IDLE_COUNT -------------------------------------------------------------------------------

IDLE_SCRIPT = """
from rlcollect import MultiSyncCollector
from tests.collectors.multiprocess.slow_envs import slow_counting_env

if __name__ == "__main__":
    with MultiSyncCollector([slow_counting_env], frames_per_batch=40) as collector:
        print("worker_timeout", collector.pool.worker_timeout, flush=True)
        collector.next()  # 40 steps of 50 ms
    print("collected", flush=True)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("idle", ["0.5", "never"])
def test_max_idle_count_bounds_the_wait_on_a_silent_worker(idle: str) -> None:
    """TorchRL's `MAX_IDLE_COUNT` environment variable: how long the collector waits on a
    worker unless `worker_timeout` is given; a value that is no number is refused, naming it."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", IDLE_SCRIPT],
        capture_output=True,
        text=True,
        timeout=100,
        env={**os.environ, "MAX_IDLE_COUNT": idle},
        cwd=Path(__file__).parents[3],
    )
    assert done.returncode != 0
    assert "collected" not in done.stdout
    if idle == "never":
        assert "MAX_IDLE_COUNT='never' must be a positive number of seconds" in done.stderr
    else:
        assert "worker_timeout 0.5" in done.stdout
        assert "0.5" in done.stderr, done.stderr[-2000:]


# --- num_threads ----------------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_threads", [None, 3])
def test_torch_threads_are_given_back_at_shutdown(
    num_threads: int | None, no_leftover_children: None
) -> None:
    """The parent runs with fewer torch threads while its workers run (or `num_threads`), and
    has its own number back after shutdown, as TorchRL's collectors do."""
    before = torch.get_num_threads()
    try:
        collector = MultiSyncCollector(
            [counting_env], frames_per_batch=8, total_frames=8, num_threads=num_threads
        )
        expected = num_threads or max(1, (os.cpu_count() or 1) - 1)
        assert torch.get_num_threads() == expected
        list(collector)
        collector.shutdown()
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)


# --- collector_class shorthands ---------------------------------------------------------------


def test_torchrl_collector_class_shorthands_name_ours(no_leftover_children: None) -> None:
    from rlcollect.collectors.children import collector_class_of

    assert collector_class_of("single") is Collector
    assert collector_class_of("sync") is MultiSyncCollector
    assert collector_class_of("async") is MultiAsyncCollector
    with MultiSyncCollector(
        [counting_env], frames_per_batch=8, total_frames=8, collector_class="single"
    ) as collector:
        assert collector.next().numel() == 8
    with pytest.raises(ValueError, match=r"collector_class='multi' is no collector.*'async'"):
        MultiSyncCollector([counting_env], frames_per_batch=8, collector_class="multi")


@pytest.mark.parametrize("collector_class", [MultiSyncCollector, MultiAsyncCollector])
def test_collector_class_none_is_collector_as_torchrl_configs_pass_it(
    collector_class: type, no_leftover_children: None
) -> None:
    """TorchRL's Hydra Multi*CollectorConfig passes collector_class=None: its default."""
    from rlcollect.collectors.children import collector_class_of

    assert collector_class_of(None) is Collector
    with collector_class(
        [counting_env, counting_env], frames_per_batch=8, total_frames=16, collector_class=None
    ) as collector:
        assert sum(batch.numel() for batch in collector) == 16


@pytest.mark.parametrize("collector_class", [MultiSyncCollector, MultiAsyncCollector])
def test_init_random_frames_reads_as_torchrl_s(
    collector_class: type, no_leftover_children: None
) -> None:
    """TorchRL's trainers compare their frame count with `collector.init_random_frames`: the
    random frames asked for in all (0 when none), as TorchRL's multi collectors keep it."""
    with collector_class(
        [counting_env, counting_env], frames_per_batch=8, total_frames=8, init_random_frames=6
    ) as collector:
        assert collector.init_random_frames == 6
    with collector_class([counting_env], frames_per_batch=8, total_frames=8) as collector:
        assert collector.init_random_frames == 0

"""Worker processes over envs whose entries differ in shape (heterogeneous agents, dynamic
specs): their batches come back pickled, with the same data as a collector in this process."""

from __future__ import annotations

import pytest
from tensordict import LazyStackedTensorDict, TensorDictBase, assert_close

from rlcollect.collectors import Collector, MultiAsyncCollector, MultiSyncCollector

mocks = pytest.importorskip("torchrl.testing.mocking_classes")
torchrl_envs = pytest.importorskip("torchrl.envs")
torchrl_utils = pytest.importorskip("torchrl.envs.utils")

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]


def hetero_env() -> object:
    env = mocks.HeterogeneousCountingEnv(max_steps=3, batch_size=(2,))
    return torchrl_envs.TransformedEnv(env, torchrl_envs.InitTracker())


def hetero_policy() -> object:
    return mocks.HeterogeneousCountingEnvPolicy(hetero_env().full_action_spec)


def batches_of(collector: object, count: int) -> list[TensorDictBase]:
    try:
        return [batch for _, batch in zip(range(count), collector, strict=False)]  # type: ignore[call-overload]
    finally:
        collector.shutdown()  # type: ignore[attr-defined]


def test_sync_workers_give_each_the_batches_of_a_collector_here() -> None:
    here = batches_of(Collector(hetero_env(), hetero_policy(), frames_per_batch=8), 2)
    workers = MultiSyncCollector(
        [hetero_env, hetero_env], hetero_policy(), frames_per_batch=16, cat_results="stack"
    )
    gathered = batches_of(workers, 2)
    for mine, reference in zip(gathered, here, strict=True):
        assert mine.batch_size == (2, 2, 4)
        assert mine.names[-1] == "time"
        assert isinstance(mine["lazy"], LazyStackedTensorDict)
        for row in mine.unbind(0):  # the counting policy is deterministic: both rows agree
            assert_close(row.exclude("collector"), reference.exclude("collector"))
    # Trajectory ids stay unique over the workers (worker i draws i, i + W, ...).
    for batch in gathered:
        ids = batch["collector", "traj_ids"]
        assert set(ids[0].unique().tolist()).isdisjoint(ids[1].unique().tolist())


@pytest.mark.parametrize("cat_results", ["stack", -1])
def test_dynamic_specs_come_back_lazily_stacked_from_sync_workers(
    cat_results: str | int,
) -> None:
    policy = torchrl_utils.RandomPolicy(mocks.EnvWithDynamicSpec().action_spec)
    workers = MultiSyncCollector(
        [mocks.EnvWithDynamicSpec] * 2, policy, frames_per_batch=20, cat_results=cat_results
    )
    for batch in batches_of(workers, 2):
        assert isinstance(batch, LazyStackedTensorDict)
        assert batch.names[-1] == "time"
        steps = batch.unbind(0) if cat_results == "stack" else [batch]
        for worker_steps in steps:
            shapes = [step.shape for step in worker_steps.get("observation", as_list=True)]
            assert shapes[:5] == [(3, count, 2) for count in range(1, 6)]
        assert batch.numel() == 20


def test_dynamic_specs_come_back_lazily_stacked_from_async_workers() -> None:
    policy = torchrl_utils.RandomPolicy(mocks.EnvWithDynamicSpec().action_spec)
    workers = MultiAsyncCollector([mocks.EnvWithDynamicSpec] * 2, policy, frames_per_batch=10)
    batches = batches_of(workers, 4)
    for batch in batches:
        assert isinstance(batch, LazyStackedTensorDict)
        assert batch.names == ["time"]
        counts = [step.shape[1] - 1 for step in batch.get("observation", as_list=True)]
        assert counts == [0, 1, 2, 3, 4] * 2  # the env counts to 5 then resets

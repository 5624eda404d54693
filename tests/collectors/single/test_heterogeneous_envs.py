"""Envs whose entries differ in shape (heterogeneous agents, dynamic specs): the step-stacked
carrier, driven side by side with TorchRL's Collector on TorchRL's own mock envs."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDictBase, assert_close

from rlcollect import Collector, ViewRequirement
from rlcollect.collectors.carrier import CarrierLayout
from rlcollect.collectors.stacked_carrier import StackedCarrierLayout
from rlcollect.envs.torchrl_env import TorchRLEnv

torchrl_collectors = pytest.importorskip("torchrl.collectors")
torchrl_envs = pytest.importorskip("torchrl.envs")
mocks = pytest.importorskip("torchrl.testing.mocking_classes")
torchrl_utils = pytest.importorskip("torchrl.envs.utils")

HETERO_FIELDS = ("camera", "lidar", "vector", "tensor_0", "tensor_1", "tensor_2")


def hetero_env(batch_size: tuple[int, ...] = (2,), max_steps: int = 3) -> object:
    return mocks.HeterogeneousCountingEnv(max_steps=max_steps, batch_size=batch_size)


def hetero_policy(env: object) -> object:
    return mocks.HeterogeneousCountingEnvPolicy(env.input_spec["full_action_spec"])  # type: ignore[attr-defined]


def random_policy(env: object) -> object:
    return torchrl_utils.RandomPolicy(env.action_spec)  # type: ignore[attr-defined]


def collect_both(
    make_env: Callable[[], object],
    make_policy: Callable[[object], object],
    batches: int = 3,
    **options: object,
) -> tuple[list[TensorDictBase], list[TensorDictBase]]:
    """`batches` batches of ours and of TorchRL's Collector, each from a fresh env and the
    same seed."""
    out: list[list[TensorDictBase]] = []
    for collector_class in (Collector, torchrl_collectors.Collector):
        env = make_env()
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # TorchRL's policy-transform notice
            collector = collector_class(env, make_policy(env), **options)
        try:
            out.append([batch for _, batch in zip(range(batches), collector, strict=False)])
        finally:
            collector.shutdown()
    return out[0], out[1]


@pytest.mark.parametrize("batch_size", [(), (2,), (2, 1)])
@pytest.mark.parametrize("frames_per_batch", [4, 16])
def test_heterogeneous_agents_give_torchrl_s_batches(
    batch_size: tuple[int, ...], frames_per_batch: int
) -> None:
    ours, theirs = collect_both(
        lambda: hetero_env(batch_size),
        hetero_policy,
        batches=2,
        frames_per_batch=frames_per_batch,
    )
    steps = frames_per_batch // max(1, torch.Size(batch_size).numel())
    for mine, reference in zip(ours, theirs, strict=True):
        # A dense batch whose "lazy" entry stacks the agents lazily, as TorchRL's.
        assert type(mine) is type(reference)
        assert isinstance(mine["lazy"], LazyStackedTensorDict)
        assert mine.batch_size == (*batch_size, steps)
        assert mine.names[-1] == "time"
        assert_close(mine, reference)
    # The agents' own shapes survive: agent 0 acts in 3 dims, agents 1 and 2 in 2.
    actions = ours[0]["lazy"]
    assert [actions[..., i]["action"].shape[-1] for i in range(3)] == [3, 2, 2]
    assert all((actions[..., i]["action"] == 1).all() for i in range(3))


def test_heterogeneous_agents_count_and_reset_as_the_env_says() -> None:
    # max_steps=3: the count runs 0..3 then the env is done and resets to 0.
    ours, _ = collect_both(lambda: hetero_env((2,), 3), hetero_policy, frames_per_batch=16)
    batch = ours[0]
    expected = torch.arange(4).repeat(2).float()
    for i, field in enumerate(("tensor_0", "tensor_1", "tensor_2")):
        agent = batch["lazy"][0][..., i][field]
        assert torch.equal(agent.reshape(8, -1).mean(-1), expected)
    done = batch["next", "lazy", "done"][0, :, 0, 0]
    assert done.tolist() == [False, False, False, True] * 2
    assert batch["collector", "traj_ids"][0].tolist() == [0] * 4 + [2] * 4


def test_dynamic_specs_give_lazily_stacked_batches_with_torchrl_s_data() -> None:
    ours, theirs = collect_both(mocks.EnvWithDynamicSpec, random_policy, frames_per_batch=20)
    for mine, reference in zip(ours, theirs, strict=True):
        assert isinstance(mine, LazyStackedTensorDict)
        assert mine.names == ["time"]
        shapes = [step.shape for step in mine.get("observation", as_list=True)]
        assert shapes == [(3, count + 1, 2) for count in [0, 1, 2, 3, 4] * 4]
        assert_close(mine, reference)


def test_dynamic_specs_with_flags_and_options_that_keep_the_steps() -> None:
    ours, theirs = collect_both(
        mocks.EnvWithDynamicSpec,
        random_policy,
        frames_per_batch=7,
        reset_at_each_iter=True,
        init_random_frames=7,
    )
    for mine, reference in zip(ours, theirs, strict=True):
        assert_close(mine.exclude("collector"), reference.exclude("collector"))
    # Ids as without reset_at_each_iter: TorchRL's start at 1 (its construction uses id 0).
    assert [batch["collector", "traj_ids"].unique().tolist() for batch in ours] == [
        [0, 1],
        [2, 3],
        [4, 5],
    ]
    env = mocks.EnvWithDynamicSpec()
    collector = Collector(env, random_policy(env), frames_per_batch=7, set_truncated=True)
    batch = collector.next()
    assert batch["next", "truncated"][-1].item()
    assert batch["next", "done"][-1].item()
    collector.shutdown()


def test_dense_envs_keep_the_preallocated_carrier() -> None:
    env = torchrl_envs.GymEnv("CartPole-v1")
    assert TorchRLEnv(env).fits_one_buffer
    collector = Collector(env, frames_per_batch=8)
    assert type(collector.layout) is CarrierLayout
    collector.shutdown()
    hetero = Collector(hetero_env(), frames_per_batch=8)
    assert type(hetero.layout) is StackedCarrierLayout
    hetero.shutdown()


def test_ragged_entries_are_named() -> None:
    assert TorchRLEnv(hetero_env()).ragged_keys == [("lazy",), ("lazy",)]  # obs, action
    dynamic = TorchRLEnv(mocks.EnvWithDynamicSpec())
    assert not dynamic.fits_one_buffer
    assert dynamic.ragged_keys == [("observation",)]


@pytest.mark.parametrize(
    ("option", "fix"),
    [
        ({"split_trajs": True}, r"split_trajs=True needs one buffer .* split the batch's"),
        ({"max_frames_per_traj": 3}, r"max_frames_per_traj=3 .* TorchRL's StepCounter"),
        ({"store_obs_once": True}, r"store_obs_once=True .* Instead, drop store_obs_once"),
        ({"trajs_per_batch": 2}, r"trajs_per_batch=2 .* \[\('observation',\)\] differ"),
    ],
)
def test_options_needing_one_buffer_are_refused(option: dict, fix: str) -> None:
    with pytest.raises(ValueError, match=fix):
        Collector(mocks.EnvWithDynamicSpec(), frames_per_batch=4, **option)


def test_rollout_storage_is_refused_for_stacked_steps() -> None:
    collector = Collector(mocks.EnvWithDynamicSpec(), frames_per_batch=4)
    rollout = collector.layout.carrier.clone()  # [T + 1] steps
    with pytest.raises(ValueError, match=r"collect_rollout\(\) fill one dense"):
        collector.collect_rollout(rollout)
    collector.shutdown()


def test_partial_reset_of_heterogeneous_agents_as_torchrl() -> None:
    after_reset = []
    for collector_class in (Collector, torchrl_collectors.Collector):
        env = hetero_env((2,), max_steps=5)
        collector = collector_class(env, hetero_policy(env), frames_per_batch=6)
        batches = iter(collector)
        next(batches)
        collector.reset(index=1)  # sub-env 1 starts over, sub-env 0 goes on
        after_reset.append(next(batches))
        collector.shutdown()
    ours, theirs = after_reset
    counts = ours["lazy"][..., 0]["tensor_0"].squeeze(-1)
    assert counts.tolist() == [[3.0, 4.0, 5.0], [0.0, 1.0, 2.0]]
    assert_close(ours.exclude("collector"), theirs.exclude("collector"))


class StopAfter:
    """TorchRL's interruptor protocol: collection stops after `steps` env steps a batch."""

    def __init__(self, steps: int) -> None:
        self.steps, self.polls = steps, 0

    def collection_stopped(self) -> bool:
        self.polls += 1
        return self.polls % self.steps == 0


def test_an_interrupted_batch_of_stacked_steps_goes_on_where_it_stopped() -> None:
    env = mocks.EnvWithDynamicSpec()
    collector = Collector(
        env,
        random_policy(env),
        frames_per_batch=6,
        interruptor=StopAfter(3),
        track_policy_version=True,
    )
    first, second = collector.next(), collector.next()
    collector.shutdown()
    for batch in (first, second):
        assert batch["collector", "traj_ids"].tolist()[3:] == [-1, -1, -1]
        assert batch["next", "policy_version"].tolist() == [0] * 6
    counts = [step.shape[1] - 1 for step in second.get("observation", as_list=True)[:3]]
    assert counts == [3, 4, 0]  # the count goes on from the first batch's third step


def test_trajectory_views_are_refused_for_stacked_steps() -> None:
    views = {"prev_action": ViewRequirement("action", shift=-1)}
    with pytest.raises(ValueError, match=r"view_requirements need one buffer .* Drop"):
        Collector(mocks.EnvWithDynamicSpec(), frames_per_batch=4, view_requirements=views)

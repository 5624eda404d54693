"""Envs whose action, reward and done keys are not at the root, side by side with TorchRL.

TorchRL's own test envs (`torchrl.testing.mocking_classes`) put their action, reward and done
flags under sub-TensorDicts with extra batch dims (`("data", "action")` of `[*B, 3, 1]`), or in
several groups at once (`MultiKeyCountingEnv`). Our collector reads the env's `action_keys`,
`reward_keys` and `done_keys` and must give TorchRL's batches, frame for frame.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from tensordict import TensorDictBase
from torch import nn

from rlcollect import Collector, MultiSyncCollector
from tests.collectors.single.torchrl_parity import assert_same_batches

mocks = pytest.importorskip("torchrl.testing.mocking_classes")
torchrl_collectors = pytest.importorskip("torchrl.collectors")

FRAMES_PER_BATCH = 10
TOTAL_FRAMES = 40


def counting_policy(env: Any) -> Any:
    """TorchRL's deterministic policy for its counting envs (one increment per step)."""
    if isinstance(env, mocks.MultiKeyCountingEnv):
        return mocks.MultiKeyCountingEnvPolicy(env.full_action_spec, deterministic=True)
    return mocks.CountingEnvCountPolicy(
        env.full_action_spec[env.action_key], action_key=env.action_key
    )


def run_both(
    make_env: Callable[[], Any],
    policy_for: Callable[[Any], Any] | None = counting_policy,
    **options,
) -> tuple[list[TensorDictBase], list[TensorDictBase]]:
    """Batches of our `Collector` and of TorchRL's over two copies of the same env."""
    batches = []
    for collector_class in (Collector, torchrl_collectors.Collector):
        env = make_env()
        policy = policy_for(env) if policy_for is not None else None
        collector = collector_class(
            env,
            policy,
            frames_per_batch=FRAMES_PER_BATCH,
            total_frames=TOTAL_FRAMES,
            **options,
        )
        batches.append(list(collector))
        collector.shutdown()
    return batches[0], batches[1]


NESTED_ENVS = {
    "everything_under_data": lambda: mocks.NestedCountingEnv(max_steps=3, batch_size=(2,)),
    "done_under_data_and_at_root": lambda: mocks.NestedCountingEnv(
        max_steps=3, has_root_done=True, batch_size=(2,)
    ),
    "only_action_and_observation_nested": lambda: mocks.NestedCountingEnv(
        max_steps=4, nest_done=False, nest_reward=False, batch_size=(2,)
    ),
    "only_reward_nested": lambda: mocks.NestedCountingEnv(
        max_steps=4, nest_obs_action=False, nest_done=False, batch_size=(2,)
    ),
    "several_action_reward_and_done_groups": lambda: mocks.MultiKeyCountingEnv(
        max_steps=3, batch_size=(2,)
    ),
}


@pytest.mark.parametrize("make_env", NESTED_ENVS.values(), ids=NESTED_ENVS.keys())
def test_nested_keys_give_torchrls_batches(make_env: Callable[[], Any]) -> None:
    ours, theirs = run_both(make_env)
    assert_same_batches(ours, theirs)
    env = make_env()
    ends = [key for key in env.done_keys if (key if isinstance(key, str) else key[-1]) == "done"]
    # Episodes ended inside batches and across their boundaries: new ids, as TorchRL's.
    ended = sum(int(batch["next", key].sum()) for batch in ours for key in ends)
    assert ended >= 4
    ids = torch.cat([batch["collector", "traj_ids"].reshape(-1) for batch in ours])
    assert int(ids.max()) >= 6


def test_nested_keys_with_set_truncated_mark_every_group() -> None:
    def make_env() -> Any:
        return mocks.MultiKeyCountingEnv(max_steps=20, batch_size=(2,)).add_truncated_keys()

    ours, theirs = run_both(make_env, set_truncated=True)
    # A documented difference: a cut marked done ends its trajectory, so the next batch starts
    # new ids (TorchRL keeps the old ones across the cut); everything else is TorchRL's.
    assert_same_batches(
        [batch.exclude("collector") for batch in ours],
        [batch.exclude("collector") for batch in theirs],
    )
    first_ids, second_ids = (batch["collector", "traj_ids"] for batch in ours[:2])
    assert not bool(torch.isin(second_ids, first_ids).any())
    for group in ((), ("nested_1",), ("nested_2",)):
        truncated = ours[0]["next", (*group, "truncated")]
        assert bool(truncated[:, -1].all())
        assert not bool(truncated[:, :-1].any())
        assert bool(ours[0]["next", (*group, "done")][:, -1].all())


@pytest.mark.parametrize("make_env", NESTED_ENVS.values(), ids=NESTED_ENVS.keys())
def test_random_actions_go_to_the_envs_action_keys(make_env: Callable[[], Any]) -> None:
    ours, theirs = run_both(make_env, policy_for=None)
    for mine, reference in zip(ours, theirs, strict=True):
        assert set(mine.keys(True, True)) == set(reference.keys(True, True))
    env = make_env()
    for key in env.action_keys:
        spec = env.full_action_spec[key]
        steps = [step for batch in ours for step in batch[key].unbind(1)]  # each [*B, ...]
        assert all(spec.is_in(step) for step in steps)
        assert len({tuple(step.flatten().tolist()) for step in steps}) > 1  # random, not zeros
    collector = Collector(make_env(), None, frames_per_batch=FRAMES_PER_BATCH)
    assert collector.stats()["frames"] == 0
    collector.shutdown()


class MultiKeyModule(nn.Module):
    """A plain module for `MultiKeyCountingEnv`: three actions from its observations (TorchRL
    hands a module every root observation entry, sub-TensorDicts whole)."""

    def forward(
        self, observation: torch.Tensor, nested_1: TensorDictBase, nested_2: TensorDictBase
    ) -> tuple[torch.Tensor, ...]:
        assert nested_1["observation"].shape[-2:] == (3, 3)
        batch = observation.shape[:-3]
        one_hot = torch.zeros(*batch, 2, dtype=torch.bool)
        one_hot[..., 1] = True
        return (
            one_hot,
            torch.ones(*batch, 3, dtype=torch.int64),
            torch.full((*batch, 2, 1), 0.5),
        )


def test_a_plain_module_is_wrapped_to_write_every_action_key() -> None:
    def make_env() -> Any:
        return mocks.MultiKeyCountingEnv(max_steps=3, batch_size=(2,))

    # TorchRL wraps such a module with out_keys [*action_keys, "output1", "output2"] and then
    # fails (more out_keys than tensors); we give each action key its tensor, in order.
    with pytest.raises(RuntimeError, match="more out_keys than tensors"):
        torchrl_collectors.Collector(make_env(), MultiKeyModule(), frames_per_batch=10)
    collector = Collector(make_env(), MultiKeyModule(), frames_per_batch=10, total_frames=20)
    batches = list(collector)
    collector.shutdown()
    reference, _ = run_both(make_env)  # TorchRL's deterministic policy writes the same actions
    for mine, expected in zip(batches, reference[: len(batches)], strict=True):
        for key in ("action", ("nested_1", "action"), ("nested_2", "azione")):
            assert mine[key].dtype == expected[key].dtype
        assert bool(mine["action"][..., 1].all())
        assert not bool(mine["action"][..., 0].any())
        assert bool((mine["nested_1", "action"] == 1).all())
        assert bool((mine["nested_2", "azione"] == 0.5).all())
        assert torch.equal(mine["next", "observation"], expected["next", "observation"])


class ActionAndLogits(nn.Module):
    """A plain module returning more tensors than the env has actions."""

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = torch.stack([observation[..., 0], -observation[..., 0]], -1)
        return logits.argmax(-1), logits


def test_extra_outputs_of_a_plain_module_get_torchrls_names() -> None:
    torchrl_envs = pytest.importorskip("torchrl.envs")
    from rlcollect.envs import GymEnv

    batches = []
    for collector_class, env in (
        (Collector, GymEnv("CartPole-v1")),
        (torchrl_collectors.Collector, torchrl_envs.GymEnv("CartPole-v1")),
    ):
        env.set_seed(3)
        collector = collector_class(env, ActionAndLogits(), frames_per_batch=20, total_frames=40)
        batches.append(list(collector))
        collector.shutdown()
    ours, theirs = batches
    assert "output1" in ours[0]
    assert ours[0]["output1"].shape == (20, 2)
    assert_same_batches(ours, theirs)


def test_max_frames_per_traj_on_grouped_done_flags_is_refused_with_the_groups() -> None:
    env = mocks.NestedCountingEnv(max_steps=3, batch_size=(2,))
    with pytest.raises(ValueError, match=r"max_frames_per_traj=5.*\('data', 'done'\)"):
        Collector(env, None, frames_per_batch=8, max_frames_per_traj=5)


def test_nested_keys_with_root_flags_accept_max_frames_per_traj() -> None:
    env = mocks.NestedCountingEnv(max_steps=50, nest_done=False, batch_size=(2,))
    collector = Collector(env, counting_policy(env), frames_per_batch=8, max_frames_per_traj=3)
    batch = collector.next()
    collector.shutdown()
    assert batch["next", "truncated"][:, 2].all()
    assert not batch["next", "truncated"][:, :2].any()
    assert batch["next", "step_count"][0, :4].flatten().tolist() == [1, 2, 3, 1]


def make_nested_env() -> Any:
    return mocks.NestedCountingEnv(max_steps=3, batch_size=(2,))


@pytest.mark.timeout(120)
def test_multi_process_workers_collect_nested_keys(no_leftover_children: None) -> None:
    env = make_nested_env()
    collector = MultiSyncCollector(
        [make_nested_env, make_nested_env],
        counting_policy(env),
        frames_per_batch=16,
        total_frames=32,
    )
    batches = list(collector)
    collector.shutdown()
    assert len(batches) == 2
    for batch in batches:
        assert batch["data", "action"].shape == (2, 2, 4, 3, 1)
        assert batch["next", "data", "reward"].shape == (2, 2, 4, 3, 1)
    ids = torch.cat([b["collector", "traj_ids"].reshape(-1) for b in batches]).unique()
    per_worker = [b["collector", "traj_ids"][i].unique() for b in batches for i in range(2)]
    assert len(per_worker[0]) + len(per_worker[1]) == len(
        torch.cat(per_worker[:2]).unique()
    )  # the two workers' ids never collide
    assert len(ids) >= 8


def nested_env_for_workers(start_val: int = 0) -> Any:
    return mocks.NestedCountingEnv(max_steps=3, start_val=start_val)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("batched_env", ["serial", "parallel"])
def test_nested_keys_in_our_batched_envs_give_torchrls_batches(
    batched_env: str, no_leftover_children: None
) -> None:
    from rlcollect.envs import ParallelEnv, SerialEnv

    torchrl_envs = pytest.importorskip("torchrl.envs")
    ours_class = SerialEnv if batched_env == "serial" else ParallelEnv
    # Sub-envs a step apart: they end at different steps, so resets are partial.
    makers = [nested_env_for_workers, functools.partial(nested_env_for_workers, 1)]
    ours_env = ours_class(2, makers)
    theirs_env = torchrl_envs.SerialEnv(2, makers)
    assert ours_env.action_keys == [("data", "action")]
    assert ours_env.done_keys == [("data", "done"), ("data", "terminated")]
    batches = []
    for collector_class, env in ((Collector, ours_env), (torchrl_collectors.Collector, theirs_env)):
        collector = collector_class(
            env,
            counting_policy(theirs_env),
            frames_per_batch=FRAMES_PER_BATCH,
            total_frames=TOTAL_FRAMES,
        )
        batches.append(list(collector))
        collector.shutdown()
    assert_same_batches(*batches)
    done = torch.cat([batch["next", "data", "done"][..., 0, 0] for batch in batches[0]], -1)
    assert bool((done[0] != done[1]).any())  # partial resets happened

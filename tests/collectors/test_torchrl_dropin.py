"""TorchRL drop-in gaps, each driven side by side with TorchRL's Collector."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule

from rlcollect import Collector
from rlcollect.envs import GymEnv
from tests.collectors.test_torchrl_parity import assert_same_batches, collect_both

torchrl_collectors = pytest.importorskip("torchrl.collectors")
torchrl_envs = pytest.importorskip("torchrl.envs")
torchrl_modules = pytest.importorskip("torchrl.modules")


def add_private_entries(batch: TensorDictBase) -> TensorDictBase:
    batch.set("_scratch", torch.zeros(batch.batch_size))
    batch.set(("next", "_seen"), torch.ones(batch.batch_size))
    batch.set(("_bookkeeping", "count"), torch.ones(batch.batch_size))
    return batch


def test_private_keys_are_left_out_of_batches_as_in_torchrl() -> None:
    ours, theirs = collect_both(postproc=add_private_entries)
    for batch in ours:
        assert "_scratch" not in batch
        assert ("next", "_seen") not in batch.keys(include_nested=True)
        assert "_bookkeeping" not in batch
    assert_same_batches(ours, theirs)


def run_both(
    ours_env: object, theirs_env: object, policy: object, **options: object
) -> tuple[list, list]:
    """Batches of our Collector on `ours_env` and of TorchRL's on `theirs_env`."""
    batches = []
    for collector_class, env in ((Collector, ours_env), (torchrl_collectors.Collector, theirs_env)):
        collector = collector_class(env, policy, frames_per_batch=20, total_frames=40, **options)
        batches.append(list(collector))
        collector.shutdown()
    return batches[0], batches[1]


def test_a_torchrl_env_class_is_called_to_make_the_env() -> None:
    pendulum = torchrl_envs.PendulumEnv
    ours, theirs = run_both(pendulum, pendulum, None)
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine.batch_size == reference.batch_size == torch.Size([20])
        assert mine["action"].shape == reference["action"].shape


def test_random_policy_without_a_spec_takes_the_envs() -> None:
    ours, theirs = run_both(
        lambda: GymEnv("Pendulum-v1"),
        lambda: torchrl_envs.GymEnv("Pendulum-v1"),
        torchrl_modules.RandomPolicy(),
    )
    for batch in (*ours, *theirs):
        assert batch["action"].shape == (20, 1)
        assert batch["action"].abs().max() <= 2.0
        assert batch["action"].std() > 0
    # Our collector over a TorchRL env, too.
    torchrl_env = torchrl_envs.GymEnv("Pendulum-v1")
    collector = Collector(torchrl_env, torchrl_modules.RandomPolicy(), frames_per_batch=20)
    assert collector.next()["action"].shape == (20, 1)
    collector.shutdown()


def test_stats_carry_torchrl_entries() -> None:
    entries = ("frames", "batches", "total_frames", "completed", "requested_frames_per_batch")
    stats = []
    for collector_class in (Collector, torchrl_collectors.Collector):
        collector = collector_class(
            torchrl_envs.GymEnv("CartPole-v1"), None, frames_per_batch=20, total_frames=40
        )
        list(collector)
        stats.append(collector.stats())
        collector.shutdown()
    ours, theirs = stats
    assert {key: ours[key] for key in entries} == {key: theirs[key] for key in entries}
    assert ours["completed"] is True
    assert ours["policy_version"] == 0


class ConstantTorque(torch.nn.Module):
    def forward(self, th: torch.Tensor) -> torch.Tensor:
        return (
            torch.full_like(th, 0.5).reshape(*th.shape[:-1], 1)
            if th.ndim
            else th.new_full((1,), 0.5)
        )


def test_max_frames_per_traj_adds_a_truncated_flag_as_torchrl_does() -> None:
    batches = []
    for collector_class in (Collector, torchrl_collectors.Collector):
        env = torchrl_envs.PendulumEnv()
        assert "truncated" not in env.done_keys
        env.set_seed(3)
        policy = TensorDictModule(ConstantTorque(), in_keys=["th"], out_keys=["action"])
        collector = collector_class(
            env, policy, frames_per_batch=12, total_frames=36, max_frames_per_traj=5
        )
        batches.append(list(collector))
        collector.shutdown()
    ours, theirs = batches
    assert ours[0]["next", "truncated"].flatten().tolist()[:6] == [False] * 4 + [True, False]
    # Resets hand TorchRL only the reset flags: the env's own params, not the buffer's zeros.
    assert torch.all(ours[0]["params", "m"] == 1.0)
    assert_same_batches(ours, theirs)


def test_collect_hooks_run_around_every_batch_as_in_torchrl() -> None:
    calls: dict[str, list] = {"ours": [], "theirs": []}

    def hooks(name: str) -> dict[str, object]:
        return {
            "pre_collect_hook": lambda: calls[name].append("pre"),
            "post_collect_hook": lambda batch: calls[name].append(
                ("post", tuple(batch.batch_size), "_scratch" in batch)
            ),
            "postproc": add_private_entries,
        }

    for name, collector_class, env in (
        ("ours", Collector, GymEnv("CartPole-v1")),
        ("theirs", torchrl_collectors.Collector, torchrl_envs.GymEnv("CartPole-v1")),
    ):
        collector = collector_class(env, None, frames_per_batch=10, total_frames=30, **hooks(name))
        list(collector)
        collector.shutdown()
    assert calls["ours"] == calls["theirs"]
    assert calls["ours"][:2] == ["pre", ("post", (10,), False)]


def test_track_traj_ids_false_leaves_the_ids_out_as_in_torchrl() -> None:
    ours, theirs = collect_both(track_traj_ids=False)
    assert ("collector", "traj_ids") not in ours[0].keys(include_nested=True)
    assert_same_batches(ours, theirs)
    with pytest.raises(ValueError, match=r"split_trajs=True .* needs track_traj_ids=True"):
        Collector("CartPole-v1", frames_per_batch=10, split_trajs=True, track_traj_ids=False)


def test_policy_factory_and_no_op_options_are_accepted() -> None:
    from tests.collectors.policies import greedy_module

    ours, theirs = collect_both(use_buffers=True, trust_policy=True)
    assert_same_batches(ours, theirs)
    collector = Collector("CartPole-v1", policy_factory=greedy_module, frames_per_batch=10)
    assert collector.next()["action"].shape == (10, 2)
    collector.shutdown()
    with pytest.raises(ValueError, match=r"use_buffers=False is not supported"):
        Collector("CartPole-v1", frames_per_batch=10, use_buffers=False)
    with pytest.raises(TypeError, match=r"policy_factory cannot be used with policy"):
        Collector("CartPole-v1", greedy_module(), policy_factory=greedy_module, frames_per_batch=4)


def test_nested_and_heterogeneous_torchrl_envs_are_refused_at_construction() -> None:
    mocks = pytest.importorskip("torchrl.testing.mocking_classes")
    cases = [
        (
            lambda: mocks.NestedCountingEnv(
                nest_obs_action=True, nest_done=True, nest_reward=True, batch_size=(2,)
            ),
            r"action_keys=\[\('data', 'action'\)\].*nested or grouped keys",
        ),
        (lambda: mocks.MultiKeyCountingEnv(batch_size=(2,)), r"one root action, one root reward"),
        (lambda: mocks.HeterogeneousCountingEnv(batch_size=(2,)), r"\('lazy', 'action'\)"),
    ]
    for make, message in cases:
        torchrl_collectors.Collector(make(), None, frames_per_batch=8, total_frames=8).shutdown()
        with pytest.raises(ValueError, match=message):
            Collector(make(), None, frames_per_batch=8)

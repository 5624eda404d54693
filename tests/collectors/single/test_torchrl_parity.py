"""Our Collector and TorchRL's, driven side by side on the same env, seed and policy."""

from __future__ import annotations

import pytest
import torch

from rlcollect import Collector
from rlcollect.envs import GymEnv
from tests.collectors.policies import greedy_module
from tests.collectors.single.torchrl_parity import assert_same_batches, collect_both

torchrl_collectors = pytest.importorskip("torchrl.collectors")
torchrl_envs = pytest.importorskip("torchrl.envs")


@pytest.mark.slow
def test_same_batches_as_torchrl() -> None:
    ours, theirs = collect_both()
    assert sum(int(b["next", "done"].sum()) for b in ours) >= 3
    assert_same_batches(ours, theirs)


@pytest.mark.slow
def test_same_batches_as_torchrl_with_max_frames_per_traj() -> None:
    ours, theirs = collect_both(max_frames_per_traj=40)
    assert any(bool(b["next", "truncated"].any()) for b in ours)
    assert_same_batches(ours, theirs)


@pytest.mark.slow
def test_same_batches_as_torchrl_with_split_trajs() -> None:
    ours, theirs = collect_both(split_trajs=True)
    assert ours[0].ndim == 2
    # TorchRL names a split batch [None, "time"] only when it holds a single trajectory and
    # [None, None] otherwise; ours is always [None, "time"] (DESIGN.md's batch contract).
    assert all(batch.names == [None, "time"] for batch in ours)
    assert_same_batches(ours, theirs, compare_names=False)


@pytest.mark.slow
def test_torchrl_env_runs_in_our_collector() -> None:
    env = torchrl_envs.GymEnv("CartPole-v1")
    env.set_seed(7)
    collector = Collector(env, greedy_module(), frames_per_batch=50, total_frames=100)
    reference_env = GymEnv("CartPole-v1")
    reference_env.set_seed(7)
    reference = Collector(reference_env, greedy_module(), frames_per_batch=50, total_frames=100)
    assert_same_batches(list(collector), list(reference))


@pytest.mark.slow
def test_torchrl_env_with_max_frames_per_traj_matches_torchrl() -> None:
    """Our step limit wraps a TorchRL env (whose specs are TorchRL's) like one of ours."""
    env = torchrl_envs.GymEnv("CartPole-v1")
    env.set_seed(7)
    collector = Collector(
        env, greedy_module(), frames_per_batch=50, total_frames=100, max_frames_per_traj=8
    )
    reference_env = torchrl_envs.GymEnv("CartPole-v1")
    reference_env.set_seed(7)
    reference = torchrl_collectors.Collector(
        reference_env, greedy_module(), frames_per_batch=50, total_frames=100, max_frames_per_traj=8
    )
    ours, theirs = list(collector), list(reference)
    assert ours[0]["next", "step_count"].max() == 8
    assert_same_batches(ours, theirs)


@pytest.mark.slow
def test_serial_env_of_torchrl_envs_matches_torchrl() -> None:
    """Our SerialEnv batches TorchRL envs (TorchRL specs, TorchRL seeding) as TorchRL's does."""
    from rlcollect.envs import SerialEnv

    def make() -> object:
        return torchrl_envs.GymEnv("CartPole-v1")

    env = SerialEnv(2, make)
    env.set_seed(3)
    collector = Collector(env, greedy_module(), frames_per_batch=400, total_frames=400)
    reference_env = torchrl_envs.SerialEnv(2, make)
    reference_env.set_seed(3)
    reference = torchrl_collectors.Collector(
        reference_env, greedy_module(), frames_per_batch=400, total_frames=400
    )
    ours, theirs = list(collector), list(reference)  # TorchRL's closes its env at the end
    collector.shutdown()
    assert ours[0]["next", "reward"].shape == (2, 200, 1)
    assert ours[0]["next", "done"].any()
    assert_same_batches(ours, theirs)


def counted_torchrl_pendulum() -> object:
    """TorchRL's own Pendulum (no "truncated" of its own) under TorchRL's StepCounter."""
    env = torchrl_envs.TransformedEnv(
        torchrl_envs.PendulumEnv(), torchrl_envs.StepCounter(max_steps=5)
    )
    env.set_seed(0)
    return env


@pytest.mark.slow
def test_torchrl_env_flags_do_not_leak_from_earlier_steps() -> None:
    """Our buffer still holds an earlier step's flags at every slot; a TorchRL env must never
    see them (its StepCounter would OR a stale "truncated" into its own)."""
    torch.manual_seed(0)
    ours = list(Collector(counted_torchrl_pendulum(), None, frames_per_batch=7, total_frames=21))
    torch.manual_seed(0)
    theirs = list(
        torchrl_collectors.Collector(
            counted_torchrl_pendulum(), None, frames_per_batch=7, total_frames=21
        )
    )
    for mine, reference in zip(ours, theirs, strict=True):
        for key in [("next", "step_count"), ("next", "truncated"), ("next", "done")]:
            assert torch.equal(mine[key], reference[key]), key


@pytest.mark.slow
def test_torchrl_envs_in_our_serial_env_truncate_only_at_the_limit() -> None:
    from rlcollect.envs import SerialEnv

    env = SerialEnv(2, counted_torchrl_pendulum)
    rollout = env.rollout(12, break_when_any_done=False)
    assert rollout["next", "step_count"][0].flatten().tolist() == [1, 2, 3, 4, 5] * 2 + [1, 2]
    assert rollout["next", "truncated"][0].flatten().nonzero().flatten().tolist() == [4, 9]
    env.close()


def torchrl_cartpole() -> object:
    return torchrl_envs.GymEnv("CartPole-v1")


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children")
def test_torchrl_envs_in_our_parallel_env_match_our_serial_env() -> None:
    """Same seeds (chained through the TorchRL envs' own seeding), same batches."""
    from rlcollect.envs import ParallelEnv, SerialEnv

    batches = []
    for env_class in (SerialEnv, ParallelEnv):
        env = env_class(2, torchrl_cartpole)
        env.set_seed(3)
        collector = Collector(env, greedy_module(), frames_per_batch=200, total_frames=200)
        batches.append(collector.next())
        collector.shutdown()
    assert batches[0]["next", "done"].any()
    assert_same_batches(batches[:1], batches[1:])

"""Collector state: state_dict / load_state_dict, seeding and reset."""

from __future__ import annotations

import io

import pytest
import torch

from rlcollect import Collector
from rlcollect.envs import GymEnv
from rlcollect.testing import CountingEnv
from rlcollect.transforms import ObservationNorm, TransformedEnv
from tests.collectors.policies import greedy_module


def test_state_dict_resumes_frames_iterations_and_ids() -> None:
    first = Collector(
        CountingEnv(episode_length=3, batch_size=(2,)), None, frames_per_batch=10, total_frames=40
    )
    seen = torch.cat([first.next() for _ in range(2)], dim=-1)
    state = first.state_dict()
    assert state["frames"] == 20
    assert state["iterations"] == 2

    resumed = Collector(
        CountingEnv(episode_length=3, batch_size=(2,)), None, frames_per_batch=10, total_frames=40
    )
    resumed.load_state_dict(state)
    assert resumed.frames == 20
    assert resumed.iterations == 2
    rest = list(resumed)
    assert len(rest) == 2
    old_ids = set(seen["collector", "traj_ids"].flatten().tolist())
    new_ids = set(torch.cat(rest, dim=-1)["collector", "traj_ids"].flatten().tolist())
    assert not old_ids & new_ids
    assert min(new_ids) == max(old_ids) + 1


def test_state_dict_restores_policy_weights() -> None:
    source = Collector(
        GymEnv("CartPole-v1"), greedy_module(seed=1), frames_per_batch=10, total_frames=10
    )
    target = Collector(
        GymEnv("CartPole-v1"), greedy_module(seed=2), frames_per_batch=10, total_frames=10
    )
    source.update_policy_weights_()
    target.load_state_dict(source.state_dict())
    for name, value in source.policy.state_dict().items():
        assert torch.equal(value, target.policy.state_dict()[name])
    assert target.policy_version == 1


def test_set_seed_makes_runs_reproducible() -> None:
    def run(seed: int) -> torch.Tensor:
        collector = Collector(
            GymEnv("CartPole-v1"), greedy_module(), frames_per_batch=30, total_frames=30
        )
        assert collector.set_seed(seed) == seed + 1
        return collector.next()["observation"]

    assert torch.equal(run(4), run(4))
    assert not torch.equal(run(4), run(5))


def test_reset_starts_new_trajectory() -> None:
    collector = Collector(
        CountingEnv(episode_length=100), None, frames_per_batch=4, total_frames=12
    )
    collector.next()
    collector.reset()
    batch = collector.next()
    assert batch["observation"].flatten().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert (batch["collector", "traj_ids"] == 1).all()


def test_weight_recv_scheme_is_polled_before_each_batch() -> None:
    class InboxScheme:
        def __init__(self) -> None:
            self.inbox: list[dict[str, torch.Tensor]] = []

        def receive(self) -> dict[str, torch.Tensor] | None:
            return self.inbox.pop() if self.inbox else None

    scheme = InboxScheme()
    collector = Collector(
        GymEnv("CartPole-v1"),
        greedy_module(),
        frames_per_batch=10,
        total_frames=30,
        weight_recv_schemes={"policy": scheme},
    )
    collector.next()
    scheme.inbox.append(
        {"linear.weight": torch.zeros(2, 4), "linear.bias": torch.tensor([0.0, 1.0])}
    )
    assert (collector.next()["action"].argmax(-1) == 1).all()
    assert collector.policy_version == 1


def running_norm_env() -> TransformedEnv:
    return TransformedEnv(CountingEnv(episode_length=5), ObservationNorm(running=True))


@pytest.mark.parametrize("max_frames_per_traj", [None, 3])
def test_state_dict_carries_env_transform_state(max_frames_per_traj: int | None) -> None:
    def make() -> Collector:
        return Collector(
            running_norm_env(),
            None,
            frames_per_batch=10,
            total_frames=40,
            max_frames_per_traj=max_frames_per_traj,
        )

    first = make()
    first.next()
    state = first.state_dict()
    assert state["env_state_dict"], "the env transforms' statistics were not saved"
    resumed = make()
    resumed.load_state_dict(state)
    # from a reset, both collectors now normalize with the same running statistics
    first.reset()
    expected = first.next()["observation"]
    assert torch.equal(resumed.next()["observation"], expected)
    assert not torch.equal(make().next()["observation"], expected), "the state changed nothing"


def test_episode_returns_restart_with_the_env() -> None:
    collector = Collector(
        CountingEnv(episode_length=4),
        None,
        frames_per_batch=5,
        total_frames=15,
        reset_at_each_iter=True,
    )
    list(collector)
    stats = collector.stats()
    assert stats["episodes"] == 3
    assert stats["mean_episode_return"] == 4.0, "an unfinished episode's reward leaked on"


def test_state_dict_carries_the_episode_statistics() -> None:
    def collector() -> Collector:
        return Collector(CountingEnv(episode_length=3), None, frames_per_batch=10)

    first = collector()
    first.next()
    resumed = collector()
    resumed.load_state_dict(torch.load(_saved(first.state_dict()), weights_only=True))
    before = first.stats()
    after = resumed.stats()
    for name in ("episodes", "mean_episode_return", "mean_return_last_100"):
        assert after[name] == before[name], name
    resumed.next()
    assert resumed.stats()["episodes"] == before["episodes"] + 3


def _saved(state: dict) -> object:
    """`state` through torch.save, as an example checkpoint stores it (weights_only load)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


@pytest.mark.parametrize("max_frames_per_traj", [None, 5])
def test_load_state_dict_between_batches_keeps_collecting(max_frames_per_traj: int | None) -> None:
    """Loading transform statistics refreshes the env's specs; the env stays bound to the
    collector's buffer, also under the collector's step limit."""
    env = TransformedEnv(GymEnv("Pendulum-v1"), ObservationNorm(loc=1.0, scale=2.0))
    collector = Collector(env, None, frames_per_batch=10, max_frames_per_traj=max_frames_per_traj)
    collector.next()
    collector.load_state_dict(collector.state_dict())
    assert collector.next()["observation"].shape == (10, 3)

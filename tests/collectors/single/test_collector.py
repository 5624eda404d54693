"""Collector: batch layout, frame counts, trajectory ids and equality with env.rollout."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from rlcollect import Collector
from rlcollect.envs import GymEnv, SerialEnv
from rlcollect.testing import CountingEnv, TensorDictCountingEnv
from rlcollect.transforms import RewardSum, StepCounter, TransformedEnv
from tests.collectors.policies import GreedyPolicy, greedy_module

CONTRACT_KEYS = {
    "observation",
    "action",
    "done",
    "terminated",
    "truncated",
    ("next", "observation"),
    ("next", "reward"),
    ("next", "done"),
    ("next", "terminated"),
    ("next", "truncated"),
    ("collector", "traj_ids"),
}


def leaf_keys(data: TensorDict) -> set:
    return set(data.keys(include_nested=True, leaves_only=True))


def test_batch_layout_single_env() -> None:
    greedy = greedy_module()
    collector = Collector(GymEnv("CartPole-v1"), greedy, frames_per_batch=64, total_frames=128)
    data = next(iter(collector))
    assert data.batch_size == torch.Size([64])
    assert data.names == ["time"]
    assert leaf_keys(data) == CONTRACT_KEYS
    assert data["next", "reward"].shape == (64, 1)
    assert data["next", "reward"].dtype == torch.float32
    assert data["done"].dtype == torch.bool
    assert data["collector", "traj_ids"].shape == (64,)
    assert data["collector", "traj_ids"].dtype == torch.int64
    assert torch.equal(data["next", "done"], data["next", "terminated"] | data["next", "truncated"])
    collector.shutdown()


def test_collector_matches_env_rollout_across_batches() -> None:
    greedy = greedy_module()
    frames_per_batch, batches = 100, 4
    env = GymEnv("CartPole-v1")
    env.set_seed(3)
    collector = Collector(env, greedy, frames_per_batch=frames_per_batch, total_frames=400)
    collected = torch.cat(list(collector), dim=0)
    reference_env = GymEnv("CartPole-v1")
    reference_env.set_seed(3)
    reference = reference_env.rollout(frames_per_batch * batches, greedy, break_when_any_done=False)
    assert int(collected["next", "done"].sum()) >= 2, "the run must cross episode boundaries"
    for key in reference.keys(include_nested=True, leaves_only=True):
        assert torch.equal(collected[key], reference[key]), key
    # after a done step, the next root is a reset observation, not the terminal one
    done_steps = collected["next", "done"].squeeze(-1).nonzero().squeeze(-1)
    for step in done_steps.tolist():
        if step + 1 < collected.shape[0]:
            assert not torch.equal(
                collected["observation"][step + 1], collected["next", "observation"][step]
            )
    collector.shutdown()


@pytest.mark.parametrize("env_class", [CountingEnv, TensorDictCountingEnv])
def test_trajectory_ids_and_frames_batched(env_class: type) -> None:
    env = env_class(episode_length=[3, 5], batch_size=(2,))
    collector = Collector(env, None, frames_per_batch=20, total_frames=60)
    assert len(collector) == 3
    batches = list(collector)
    assert len(batches) == 3
    data = torch.cat(batches, dim=-1)
    assert batches[0].batch_size == torch.Size([2, 10])
    assert batches[0].names == [None, "time"]
    assert data.numel() == 60
    ids = data["collector", "traj_ids"]
    observation = data["observation"].squeeze(-1)
    # ids change exactly where an episode starts (observation back to 0), never elsewhere
    starts = observation[:, 1:] == 0
    changed = ids[:, 1:] != ids[:, :-1]
    assert torch.equal(starts, changed)
    # ids are unique per trajectory across envs and batches, and handed out in step order
    all_ids = torch.unique(ids)
    assert all_ids.tolist() == list(range(len(all_ids)))
    assert ids[0, 0] == 0
    assert ids[1, 0] == 1
    assert data["next", "observation"][0, :4].flatten().tolist() == [1.0, 2.0, 3.0, 1.0]


def test_frame_count_rounding_warns() -> None:
    with pytest.warns(UserWarning, match="not a multiple of the env batch 3"):
        collector = Collector(
            CountingEnv(batch_size=(3,)), None, frames_per_batch=10, total_frames=100
        )
    assert collector.frames_per_batch == 12
    assert collector.total_frames == 108
    assert len(collector) == 9
    count = sum(1 for _ in collector)
    assert count == 9
    assert collector.frames == 108


def test_len_matches_iteration_without_premature_stop() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collector = Collector(CountingEnv(), None, frames_per_batch=7, total_frames=50)
    assert len(collector) == math.ceil(50 / 7)
    assert sum(1 for _ in collector) == len(collector)
    with pytest.raises(StopIteration):
        collector.next()


def test_next_mixed_with_for_loop() -> None:
    collector = Collector(CountingEnv(), None, frames_per_batch=5, total_frames=20)
    first = collector.next()
    rest = list(collector)
    assert len(rest) == 3
    assert first["collector", "traj_ids"][0] == 0
    assert collector.frames == 20


def test_max_frames_per_traj_counts_and_truncates() -> None:
    env = CountingEnv(episode_length=100, batch_size=(2,))
    collector = Collector(env, None, frames_per_batch=24, total_frames=48, max_frames_per_traj=4)
    data = torch.cat(list(collector), dim=-1)
    next_count = data["next", "step_count"].squeeze(-1)
    root_count = data["step_count"].squeeze(-1)
    assert next_count[0, :9].tolist() == [1, 2, 3, 4, 1, 2, 3, 4, 1]
    assert root_count[0, :9].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0]
    truncated = data["next", "truncated"].squeeze(-1)
    assert torch.equal(truncated, next_count == 4)
    assert torch.equal(data["next", "done"].squeeze(-1), truncated)
    assert not data["next", "terminated"].any()
    # a truncated trajectory restarts from a reset observation with a new id
    assert torch.equal(data["observation"][0, 4], torch.zeros(1))
    assert data["collector", "traj_ids"][0, 4] != data["collector", "traj_ids"][0, 3]


def test_step_count_restarts_after_every_done() -> None:
    env = CountingEnv(episode_length=[3, 4], batch_size=(2,))
    collector = Collector(env, None, frames_per_batch=40, total_frames=40, max_frames_per_traj=10)
    data = next(iter(collector))
    next_count = data["next", "step_count"].squeeze(-1)
    done = data["next", "done"].squeeze(-1)
    after_done = torch.nn.functional.pad(done[:, :-1], (1, 0), value=False)
    assert (next_count[after_done] == 1).all()
    assert torch.equal(next_count, data["next", "observation"].squeeze(-1).long())


def test_max_frames_per_traj_refuses_env_that_counts() -> None:
    from rlcollect.transforms import StepCounter, TransformedEnv

    env = TransformedEnv(GymEnv("CartPole-v1"), StepCounter())
    with pytest.raises(ValueError, match="already counts steps"):
        Collector(env, None, frames_per_batch=10, max_frames_per_traj=5)


def test_reset_at_each_iter_starts_fresh_trajectories() -> None:
    collector = Collector(
        CountingEnv(episode_length=100),
        None,
        frames_per_batch=5,
        total_frames=15,
        reset_at_each_iter=True,
    )
    batches = list(collector)
    for index, batch in enumerate(batches):
        assert batch["observation"].flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
        assert (batch["collector", "traj_ids"] == index).all()


def test_trajectories_continue_across_batches() -> None:
    collector = Collector(
        CountingEnv(episode_length=100), None, frames_per_batch=5, total_frames=10
    )
    _first, second = list(collector)
    assert second["observation"].flatten().tolist() == [5.0, 6.0, 7.0, 8.0, 9.0]
    assert (second["collector", "traj_ids"] == 0).all()


def test_error_mid_batch_restarts_from_a_reset() -> None:
    """After a policy error the env has moved on: the next batch must not carry over slot T."""
    calls = {"n": 0, "fail_at": 8}

    def act(observation: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == calls["fail_at"]:
            raise RuntimeError("policy failed")
        return torch.zeros(observation.shape[:-1], dtype=torch.int64)

    policy = TensorDictModule(act, in_keys=["observation"], out_keys=["action"])
    collector = Collector(CountingEnv(episode_length=100), policy, frames_per_batch=5)
    calls["n"] = 0  # the construction probe called the policy once
    first = collector.next()
    with pytest.raises(RuntimeError, match="policy failed"):
        collector.next()  # the env stepped twice more before the error
    after = collector.next()
    assert after["observation"].flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert (after["collector", "traj_ids"] > first["collector", "traj_ids"].max()).all()


def test_set_truncated_marks_last_step() -> None:
    collector = Collector(
        CountingEnv(episode_length=100, batch_size=(2,)),
        None,
        frames_per_batch=10,
        total_frames=20,
        set_truncated=True,
    )
    first, second = list(collector)
    assert first["next", "truncated"][:, -1].all()
    assert first["next", "done"][:, -1].all()
    assert not first["next", "truncated"][:, :-1].any()
    assert not first["next", "terminated"].any()
    assert (second["collector", "traj_ids"] != first["collector", "traj_ids"][:, -1:]).all()
    # the cut is not a reset: the next batch goes on from where the env stood
    assert torch.equal(second["observation"][:, 0], first["next", "observation"][:, -1])


def test_init_random_frames_then_policy() -> None:
    policy = TensorDictModule(
        lambda observation: torch.ones(observation.shape[:-1], dtype=torch.int64),
        in_keys=["observation"],
        out_keys=["action"],
    )
    torch.manual_seed(0)
    collector = Collector(
        CountingEnv(batch_size=(4,)),
        policy,
        frames_per_batch=40,
        total_frames=120,
        init_random_frames=50,
    )
    assert collector.init_random_frames == 80
    batches = list(collector)
    random_actions = torch.cat([b["action"] for b in batches[:2]])
    assert (random_actions == 0).any()
    assert (random_actions == 1).any()
    assert (batches[2]["action"] == 1).all()


def test_return_same_td_and_fresh_batches() -> None:
    same = Collector(CountingEnv(), None, frames_per_batch=5, total_frames=10, return_same_td=True)
    a, b = list(same)
    assert a is b
    fresh = Collector(CountingEnv(), None, frames_per_batch=5, total_frames=10)
    c = fresh.next()
    snapshot = c.clone()
    fresh.next()
    assert torch.equal(c["observation"], snapshot["observation"]), "a yielded batch changed"


def test_postproc_applied_after_split() -> None:
    seen = []

    def postproc(batch: TensorDict) -> TensorDict:
        seen.append(batch.batch_size)
        batch.set("marker", torch.ones(batch.batch_size))
        return batch

    collector = Collector(
        CountingEnv(episode_length=4),
        None,
        frames_per_batch=10,
        total_frames=10,
        split_trajs=True,
        postproc=postproc,
    )
    data = collector.next()
    assert seen == [torch.Size([3, 4])]
    assert "marker" in data
    assert data["collector", "mask"].sum() == 10
    assert data["collector", "mask"].tolist()[-1] == [True, True, False, False]


def test_plain_module_is_wrapped_by_argument_name() -> None:
    collector = Collector(
        GymEnv("CartPole-v1"), GreedyPolicy(), frames_per_batch=10, total_frames=10
    )
    data = collector.next()
    assert data["action"].sum(-1).eq(1).all()


def test_plain_module_is_wrapped_under_max_frames_per_traj() -> None:
    class ReadsX(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return GreedyPolicy()(x)

    collector = Collector(
        "CartPole-v1", ReadsX(), frames_per_batch=10, total_frames=10, max_frames_per_traj=4
    )
    data = collector.next()
    assert data["action"].sum(-1).eq(1).all()
    assert data["next", "step_count"].max() == 4


def test_policy_with_extra_outputs_is_stored() -> None:
    class WithLogits(nn.Module):
        def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            logits = torch.stack([observation.sum(-1), -observation.sum(-1)], -1)
            return nn.functional.one_hot(logits.argmax(-1), 2), logits

    policy = TensorDictModule(WithLogits(), in_keys=["observation"], out_keys=["action", "logits"])
    collector = Collector(GymEnv("CartPole-v1"), policy, frames_per_batch=10, total_frames=10)
    data = collector.next()
    assert data["logits"].shape == (10, 2)
    assert torch.equal(data["action"].argmax(-1), data["logits"].argmax(-1))


def test_tensordict_policy_fallback_path() -> None:
    class DictPolicy(nn.Module):
        def forward(self, tensordict: TensorDict) -> TensorDict:
            count = tensordict["observation"].squeeze(-1)
            tensordict["action"] = count.long() % 2
            return tensordict

    collector = Collector(
        CountingEnv(episode_length=100), DictPolicy(), frames_per_batch=6, total_frames=6
    )
    data = collector.next()
    assert data["action"].tolist() == [0, 1, 0, 1, 0, 1]


def test_track_policy_version() -> None:
    collector = Collector(
        GymEnv("CartPole-v1"),
        greedy_module(),
        frames_per_batch=10,
        total_frames=30,
        track_policy_version=True,
    )
    first = collector.next()
    collector.update_policy_weights_()
    second = collector.next()
    assert (first["next", "policy_version"] == 0).all()
    assert (second["next", "policy_version"] == 1).all()
    assert collector.policy_version == 1


def test_update_policy_weights_changes_actions() -> None:
    module = GreedyPolicy()
    with torch.no_grad():
        module.linear.weight.zero_()
        module.linear.bias.copy_(torch.tensor([1.0, 0.0]))
    policy = TensorDictModule(module, in_keys=["observation"], out_keys=["action"])
    collector = Collector(GymEnv("CartPole-v1"), policy, frames_per_batch=20, total_frames=60)
    assert (collector.next()["action"].argmax(-1) == 0).all()
    flipped = GreedyPolicy()
    with torch.no_grad():
        flipped.linear.weight.zero_()
        flipped.linear.bias.copy_(torch.tensor([0.0, 1.0]))
    collector.update_policy_weights_(flipped)
    assert (collector.next()["action"].argmax(-1) == 1).all()
    collector.update_policy_weights_(
        {"linear.weight": torch.zeros(2, 4), "linear.bias": torch.tensor([1.0, 0.0])}
    )
    assert (collector.next()["action"].argmax(-1) == 0).all()
    assert collector.policy_version == 2


def test_stats_counts_episodes_and_returns() -> None:
    collector = Collector(
        CountingEnv(episode_length=4, batch_size=(2,)), None, frames_per_batch=20, total_frames=40
    )
    list(collector)
    stats = collector.stats()
    assert stats["frames"] == 40
    assert stats["batches"] == 2
    assert stats["episodes"] == 10
    assert stats["mean_episode_return"] == 4.0
    assert stats["frames_per_second"] > 0


def test_stats_episode_returns_span_batches() -> None:
    collector = Collector(CountingEnv(episode_length=7), None, frames_per_batch=5, total_frames=15)
    list(collector)
    stats = collector.stats()
    assert stats["episodes"] == 2
    assert stats["mean_episode_return"] == 7.0


def test_stats_mean_return_last_100_is_the_window_of_finished_episodes() -> None:
    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    collector = Collector(env, None, frames_per_batch=500, total_frames=4000)
    assert math.isnan(collector.stats()["mean_return_last_100"])
    returns: list[float] = []  # finished episodes, in the order they finished
    running = 0.0
    for batch in collector:
        for reward, done in zip(
            batch["next", "reward"].flatten().tolist(),
            batch["next", "done"].flatten().tolist(),
            strict=True,
        ):
            running += reward
            if done:
                returns.append(running)
                running = 0.0
    assert len(returns) > 120, "random CartPole episodes are short: the window is full"
    stats = collector.stats()
    assert stats["episodes"] == len(returns)
    assert stats["mean_return_last_100"] == pytest.approx(sum(returns[-100:]) / 100)
    assert stats["mean_return_last_100"] != pytest.approx(sum(returns) / len(returns))


def test_exploration_type_is_set_during_collection() -> None:
    from tensordict.nn import InteractionType
    from tensordict.nn.probabilistic import interaction_type

    seen = []

    class Probe(nn.Module):
        def forward(self, observation: torch.Tensor) -> torch.Tensor:
            seen.append(interaction_type())
            return torch.zeros(observation.shape[:-1], dtype=torch.int64)

    collector = Collector(
        CountingEnv(),
        TensorDictModule(Probe(), ["observation"], ["action"]),
        frames_per_batch=2,
        total_frames=2,
        exploration_type=InteractionType.DETERMINISTIC,
    )
    collector.next()
    assert seen[-1] == InteractionType.DETERMINISTIC


def test_gym_id_string_and_callable() -> None:
    by_id = Collector("CartPole-v1", None, frames_per_batch=10, total_frames=10)
    by_callable = Collector(
        lambda: GymEnv("Pendulum-v1"), None, frames_per_batch=10, total_frames=10
    )
    assert by_id.next()["observation"].shape == (10, 4)
    assert by_callable.next()["action"].shape == (10, 1)


def test_context_manager_closes_env() -> None:
    env = GymEnv("CartPole-v1")
    with Collector(env, None, frames_per_batch=10, total_frames=10) as collector:
        collector.next()
    assert env.is_closed


def test_outer_transform_over_sub_envs_with_their_own_transforms() -> None:
    """An outer TransformedEnv steps the batched env through its TensorDict face: the
    sub-envs' step counters must still advance and truncate."""

    def inner() -> TransformedEnv:
        return TransformedEnv(GymEnv("CartPole-v1"), StepCounter(max_steps=5))

    collector = Collector(
        TransformedEnv(SerialEnv(2, inner), RewardSum()), None, frames_per_batch=16
    )
    data = collector.next()
    assert data["step_count"][0, :8].flatten().tolist()[:6] == [0, 1, 2, 3, 4, 0]
    assert data["next", "truncated"][0, 4].item()
    reward_sum = data["next", "episode_reward"][0, :5].flatten().tolist()
    assert reward_sum == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_stats_mean_length_last_100_counts_steps_across_batches() -> None:
    env = SerialEnv(2, lambda: GymEnv("FrozenLake-v1"))  # lengths vary; returns are 0 or 1
    env.set_seed(0)
    collector = Collector(env, None, frames_per_batch=64, total_frames=2048)
    assert math.isnan(collector.stats()["mean_length_last_100"])
    lengths: list[int] = []  # in the order the tracker records them: sub-env, then time
    running = [0, 0]
    for batch in collector:
        done = batch["next", "done"].reshape(2, -1)
        for sub_env in range(2):
            for step in range(done.shape[-1]):
                running[sub_env] += 1
                if bool(done[sub_env, step]):
                    lengths.append(running[sub_env])
                    running[sub_env] = 0
    stats = collector.stats()
    assert stats["episodes"] == len(lengths) > 100
    assert stats["mean_length_last_100"] == pytest.approx(sum(lengths[-100:]) / 100)
    assert stats["mean_length_last_100"] != pytest.approx(stats["mean_return_last_100"])


def test_stats_weight_update_seconds_is_the_last_update() -> None:
    policy = TensorDictModule(nn.Linear(4, 2), in_keys=["observation"], out_keys=["action"])
    collector = Collector(GymEnv("CartPole-v1"), policy, frames_per_batch=10, total_frames=20)
    assert math.isnan(collector.stats()["weight_update_seconds"])
    collector.update_policy_weights_()
    assert 0.0 <= collector.stats()["weight_update_seconds"] < 60.0
    collector.shutdown()

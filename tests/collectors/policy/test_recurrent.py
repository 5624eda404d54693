"""Recurrent policies: state written to `("next", key)` reaches the root of the next step."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase

from rlcollect import Collector
from rlcollect.envs import GymEnv, SerialEnv
from rlcollect.testing import CountingEnv
from rlcollect.transforms import InitTracker, TransformedEnv
from tests.collectors.policy.recurrent_policies import lstm_policy
from tests.collectors.single.torchrl_parity import assert_same_batches


class StepMemory(TensorDictModuleBase):
    """Remembers how many steps it took since its state was cleared (`hidden + 1`); like
    TorchRL's `LSTMModule`, it starts from zeros when the root has no state yet."""

    in_keys = ["observation", "hidden"]
    out_keys = ["action", ("next", "hidden")]

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        hidden = td.get("hidden", None)
        if hidden is None:
            hidden = torch.zeros(*td.batch_size, 1)
        td.set("action", torch.zeros(td.batch_size, dtype=torch.int64))
        td.set(("next", "hidden"), hidden + 1)
        return td


def memory_policy() -> StepMemory:
    return StepMemory()


def test_policy_state_is_carried_and_cleared_at_resets() -> None:
    """CountingEnv's observation counts the steps since a reset: so must the carried state."""
    collector = Collector(
        CountingEnv(episode_length=4, batch_size=(2,)), memory_policy(), frames_per_batch=14
    )
    for _ in range(3):  # across batch boundaries too
        data = collector.next()
        assert torch.equal(data["hidden"], data["observation"])
        assert torch.equal(data["next", "hidden"], data["next", "observation"])
    assert data["next", "done"].any()


def test_state_restarts_with_every_reset_of_the_collector() -> None:
    collector = Collector(
        CountingEnv(episode_length=100),
        memory_policy(),
        frames_per_batch=5,
        reset_at_each_iter=True,
    )
    for _ in range(2):
        assert collector.next()["hidden"].flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_state_follows_max_frames_per_traj_truncation() -> None:
    collector = Collector(
        CountingEnv(episode_length=100), memory_policy(), frames_per_batch=8, max_frames_per_traj=3
    )
    data = collector.next()
    assert data["hidden"].flatten().tolist() == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0, 0.0, 1.0]


def test_general_tensordict_policy_path_carries_state_too() -> None:
    def step(td: TensorDictBase) -> TensorDictBase:
        td.set("action", torch.zeros(td.batch_size, dtype=torch.int64))
        td.set(("next", "hidden"), td.get("hidden", torch.zeros(*td.batch_size, 1)) + 1)
        return td

    collector = Collector(CountingEnv(episode_length=3), step, frames_per_batch=7)
    data = collector.next()
    assert torch.equal(data["hidden"], data["observation"])


pytest.importorskip("torchrl.modules")
torchrl_envs = pytest.importorskip("torchrl.envs")
torchrl_collectors = pytest.importorskip("torchrl.collectors")


def torchrl_recurrent_batches(kind: str = "lstm") -> list[TensorDictBase]:
    """TorchRL's collector with its LSTM recipe: InitTracker and the LSTM's state primer."""
    policy, lstm = lstm_policy(kind)
    env = torchrl_envs.TransformedEnv(
        torchrl_envs.GymEnv("CartPole-v1"),
        torchrl_envs.Compose(torchrl_envs.InitTracker(), lstm.make_tensordict_primer()),
    )
    env.set_seed(0)
    return list(torchrl_collectors.Collector(env, policy, frames_per_batch=40, total_frames=80))


@pytest.mark.slow
def test_torchrl_lstm_on_a_torchrl_env_matches_torchrl() -> None:
    policy, lstm = lstm_policy()
    env = torchrl_envs.TransformedEnv(
        torchrl_envs.GymEnv("CartPole-v1"),
        torchrl_envs.Compose(torchrl_envs.InitTracker(), lstm.make_tensordict_primer()),
    )
    env.set_seed(0)
    ours = list(Collector(env, policy, frames_per_batch=40, total_frames=80))
    theirs = torchrl_recurrent_batches()
    assert any(bool(batch["next", "done"].any()) for batch in ours)
    assert_same_batches(ours, theirs)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_torchrl_rnn_on_our_env_without_primer_matches_torchrl(kind: str) -> None:
    """We carry the state ourselves (zeroed at resets), as TorchRL's primer does."""
    policy, _ = lstm_policy(kind)
    env = TransformedEnv(GymEnv("CartPole-v1"), InitTracker())
    env.set_seed(0)
    ours = list(Collector(env, policy, frames_per_batch=40, total_frames=80))
    theirs = torchrl_recurrent_batches(kind)
    assert_same_batches(ours, theirs)
    hidden = ours[0]["recurrent_state_h" if kind == "lstm" else "recurrent_state"]
    assert hidden[1].abs().sum() > 0, "the state never reached the root"
    assert (hidden[ours[0]["is_init"].flatten()] == 0).all()


@pytest.mark.slow
def test_torchrl_lstm_over_batched_envs() -> None:
    policy, _ = lstm_policy()
    env = SerialEnv(2, lambda: TransformedEnv(GymEnv("CartPole-v1"), InitTracker()))
    data = Collector(env, policy, frames_per_batch=80, total_frames=80).next()
    assert data["recurrent_state_h"].shape == (2, 40, 1, 8)
    carried = ~data["next", "done"][:, :-1].flatten()
    after = data["recurrent_state_h"][:, 1:].flatten(0, 1)[carried]
    before = data["next", "recurrent_state_h"][:, :-1].flatten(0, 1)[carried]
    assert torch.equal(after, before)

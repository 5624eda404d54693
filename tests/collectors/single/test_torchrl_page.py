"""The methods of TorchRL's Collector page on our `Collector`, called as on TorchRL's, on
TorchRL's CartPole and a `TensorDictModule`."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from rlcollect import Collector
from rlcollect.testing import CountingEnv
from tests.collectors.policies import greedy_module

torchrl_collectors = pytest.importorskip("torchrl.collectors")
torchrl_envs = pytest.importorskip("torchrl.envs")
torchrl_data = pytest.importorskip("torchrl.data")


SEEDS = itertools.count()


def make_policy() -> TensorDictModule:
    """CartPole's greedy one-hot policy, with weights of its own."""
    return greedy_module(seed=next(SEEDS))


def both(policy: Any = None, **options: Any) -> tuple[Collector, Any]:
    """Our collector and TorchRL's on the same arguments."""
    arguments = {
        "frames_per_batch": 10,
        "total_frames": 30,
        "auto_register_policy_transforms": False,
        **options,
    }
    ours = Collector(torchrl_envs.GymEnv("CartPole-v1"), policy, **arguments)
    theirs = torchrl_collectors.Collector(torchrl_envs.GymEnv("CartPole-v1"), policy, **arguments)
    return ours, theirs


@pytest.fixture
def pair() -> Any:
    ours, theirs = both(make_policy(), track_policy_version=True)
    yield ours, theirs
    ours.shutdown()
    theirs.shutdown()


def test_policy_versions_count_increments(pair: tuple[Collector, Any]) -> None:
    for collector in pair:
        assert collector.get_policy_version() == collector.policy_version == 0
        collector.increment_version()
        assert collector.get_policy_version() == 1
    ours, _ = pair
    ours.update_policy_weights_()
    assert ours.policy_version == 2
    assert int(ours.next()["next", "policy_version"].unique()) == 2


def test_getattr_env_policy_and_model(pair: tuple[Collector, Any]) -> None:
    for collector in pair:
        assert collector.getattr_env("batch_size") == torch.Size([])
        assert collector.getattr_policy("in_keys") == ["observation"]
        assert collector.get_model("policy").out_keys == ["action"]
        assert collector.get_model("env").batch_size == torch.Size([])
    with pytest.raises(AttributeError, match="'nope' does not exist"):
        pair[0].get_model("env.nope")


def test_getattr_rb_reads_the_replay_buffer() -> None:
    for build in (Collector, torchrl_collectors.Collector):
        buffer = torchrl_data.ReplayBuffer(storage=torchrl_data.ListStorage(100))
        collector = build(
            torchrl_envs.GymEnv("CartPole-v1"), frames_per_batch=10, replay_buffer=buffer
        )
        collector.next()
        assert collector.getattr_rb("write_count") == 10
        collector.shutdown()
    bare = Collector(CountingEnv(), frames_per_batch=4)
    with pytest.raises(AttributeError, match=r"getattr_rb\('write_count'\): .* no replay_buffer"):
        bare.getattr_rb("write_count")


def test_iterator_and_rollout_give_batches_of_the_same_shape(pair: tuple[Collector, Any]) -> None:
    ours, theirs = pair
    assert ours.rollout().batch_size == theirs.rollout().batch_size == (10,)
    ours_batches = [batch.batch_size for batch in ours.iterator()]
    their_batches = [batch.batch_size for batch in theirs.iterator()]
    # rollout() counts towards total_frames here; TorchRL's does not
    assert ours_batches == their_batches[:2] == [torch.Size([10])] * 2


def test_shutdown_seed_reset_and_load_state_dict_keyword_forms(pair: tuple[Collector, Any]) -> None:
    ours, theirs = pair
    assert ours.set_seed(3) == theirs.set_seed(3)  # the env's next seed
    for collector in pair:
        collector.next()
        assert collector.set_seed(3, static_seed=True) == 3
        collector.reset()
        state = collector.state_dict()
        collector.load_state_dict(state_dict=state)
        collector.shutdown(timeout=1.0, close_env=True, raise_on_error=False)


def test_reset_of_some_sub_envs_restarts_those_alone() -> None:
    """TorchRL's reset(index=...) (side by side with TorchRL's in test_torchrl_reset_index.py):
    sub-env 0 counts from 0 again under a new trajectory id, sub-env 1 goes on."""
    collector = Collector(CountingEnv(batch_size=(2,), episode_length=100), frames_per_batch=6)
    batches = iter(collector)
    next(batches)
    collector.reset(index=0)
    batch = next(batches)
    assert batch["observation"].squeeze(-1).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert batch["collector", "traj_ids"][:, 0].tolist() == [2, 1]
    collector.shutdown()


def test_static_seed_of_an_env_of_several_sub_envs_is_refused() -> None:
    collector = Collector(CountingEnv(batch_size=(2,)), frames_per_batch=4)
    with pytest.raises(ValueError, match=r"set_seed\(static_seed=True\) .* 2 sub-envs"):
        collector.set_seed(0, static_seed=True)


def test_shutdown_raise_on_error_false_warns() -> None:
    collector = Collector(CountingEnv(), frames_per_batch=4)

    def failing_close() -> None:
        raise RuntimeError("env close failed")

    collector.env.close = failing_close  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="env close failed"):
        collector.shutdown()
    with pytest.warns(RuntimeWarning, match="env close failed"):
        collector.shutdown(raise_on_error=False)


# --- weights ------------------------------------------------------------------------------------


def test_weights_dict_and_model_id_load_the_policy(pair: tuple[Collector, Any]) -> None:
    trained = make_policy()
    for collector in pair:
        collector.update_policy_weights_(weights_dict={"policy": TensorDict.from_module(trained)})
        torch.testing.assert_close(
            collector.get_model("policy").module.linear.weight, trained.module.linear.weight
        )
    other = make_policy()
    ours = pair[0]
    ours.update_policy_weights_(TensorDict.from_module(other), model_id="policy")
    torch.testing.assert_close(
        ours.get_model("policy").module.linear.weight, other.module.linear.weight
    )
    with pytest.raises(KeyError, match=r"model id 'value' names no model of the Collector"):
        ours.update_policy_weights_(weights_dict={"value": {}})
    with pytest.raises(ValueError, match=r"got weights_dict and weights"):
        ours.update_policy_weights_(policy=other, weights_dict={"policy": other})


def test_receive_weights_forms(pair: tuple[Collector, Any]) -> None:
    for form in ("positional", "policy", "weights"):
        trained = make_policy()
        for collector in pair:
            if form == "positional":
                collector.receive_weights(trained)
            elif form == "policy":
                collector.receive_weights(policy=trained)
            else:
                collector.receive_weights(weights=TensorDict.from_module(trained))
            torch.testing.assert_close(
                collector.get_model("policy").module.linear.bias, trained.module.linear.bias
            )


class HeldWeights:
    """A receive scheme holding weights once."""

    def __init__(self, weights: Any) -> None:
        self.weights = weights

    def receive(self) -> Any:
        weights, self.weights = self.weights, None
        return weights


def test_register_scheme_receiver_applies_and_polls_what_it_holds() -> None:
    policy, trained = make_policy(), make_policy()
    collector = Collector(torchrl_envs.GymEnv("CartPole-v1"), policy, frames_per_batch=10)
    scheme = HeldWeights(TensorDict.from_module(trained))
    collector.register_scheme_receiver({"policy": scheme})
    torch.testing.assert_close(policy.module.linear.weight, trained.module.linear.weight)
    assert collector.policy_version == 1
    with pytest.raises(ValueError, match="receives them from its schemes"):
        collector.receive_weights(trained)
    scheme.weights = TensorDict.from_module(make_policy())
    collector.receive_weights()
    assert collector.policy_version == 2
    with pytest.raises(TypeError, match=r"weight_recv_schemes\['policy'\] must have a receive"):
        collector.register_scheme_receiver({"policy": object()})
    collector.shutdown()


def test_cascade_execute_and_init_updater(pair: tuple[Collector, Any]) -> None:
    ours, theirs = pair
    assert ours.cascade_execute("env.set_seed", 5) == theirs.cascade_execute("env.set_seed", 5)
    for collector in pair:
        assert collector.cascade_execute("env.batch_size") == torch.Size([])
        assert collector.init_updater() is None
    with pytest.raises(ValueError, match=r"'env.batch_size' is not callable"):
        pair[0].cascade_execute("env.batch_size", 1)
    with pytest.raises(ValueError, match=r"cannot be read at position 3"):
        pair[0].cascade_execute("env..set_seed")

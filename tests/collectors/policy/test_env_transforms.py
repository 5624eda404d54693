"""`auto_register_policy_transforms`: the init flag and state primer a recurrent policy needs,
appended to the env as TorchRL's collector appends them; each case beside TorchRL's Collector."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from tensordict.nn import TensorDictModule, TensorDictSequential

from rlcollect import Collector
from rlcollect.envs import GymEnv
from tests.collectors.policy.recurrent_policies import lstm_policy

torchrl_collectors = pytest.importorskip("torchrl.collectors")
torchrl_envs = pytest.importorskip("torchrl.envs")
torchrl_modules = pytest.importorskip("torchrl.modules")

BOTH = pytest.mark.parametrize("collector_class", ["ours", "torchrl"])
OPTIONS = {"frames_per_batch": 10, "total_frames": 20}


def make_collector(collector_class: str, *args: Any, **kwargs: Any) -> Any:
    cls = Collector if collector_class == "ours" else torchrl_collectors.Collector
    return cls(*args, **OPTIONS, **kwargs)


def gru_features() -> TensorDictSequential:
    """A GRU that writes features and its next state, and no action (TorchRL's test policy)."""
    gru = torchrl_modules.GRUModule(
        input_size=4,
        hidden_size=8,
        num_layers=1,
        in_keys=["observation", "recurrent_state", "is_init"],
        out_keys=["features", ("next", "recurrent_state")],
    )
    return TensorDictSequential(gru)


def count_leaves(spec: Any, name: str) -> int:
    found = spec.keys(include_nested=True, leaves_only=True)
    return sum(1 for key in found if (key if isinstance(key, str) else key[-1]) == name)


def torchrl_cartpole() -> Any:
    return torchrl_envs.GymEnv("CartPole-v1")


@BOTH
def test_true_appends_torchrl_init_tracker_and_primer_to_a_torchrl_env(
    collector_class: str,
) -> None:
    collector = make_collector(
        collector_class, torchrl_cartpole(), gru_features(), auto_register_policy_transforms=True
    )
    try:
        spec = collector.env.full_observation_spec
        assert count_leaves(spec, "is_init") == 1
        assert count_leaves(spec, "recurrent_state") == 1
        names = [type(transform).__name__ for transform in collector.env.transform]
        assert names == ["InitTracker", "TensorDictPrimer"]
        assert all(transform.parent is not None for transform in collector.env.transform)
        assert collector.env.action_spec is not None
        # The policy writes no action: built as TorchRL builds it, then collecting fails.
        with pytest.raises(KeyError, match="action"):
            next(iter(collector))
    finally:
        collector.shutdown()


@BOTH
def test_policy_factory_gets_its_transforms_too(collector_class: str) -> None:
    collector = make_collector(
        collector_class,
        torchrl_cartpole(),
        policy_factory=gru_features,
        auto_register_policy_transforms=True,
    )
    try:
        spec = collector.env.full_observation_spec
        assert count_leaves(spec, "is_init") == count_leaves(spec, "recurrent_state") == 1
    finally:
        collector.shutdown()


def env_built_with_the_policy() -> Any:
    return torchrl_envs.GymEnv("CartPole-v1", policy=gru_features())


def serial_env_whose_children_track_init() -> Any:
    def child() -> Any:
        return torchrl_envs.TransformedEnv(
            torchrl_envs.GymEnv("CartPole-v1"), torchrl_envs.InitTracker()
        )

    return torchrl_envs.SerialEnv(2, child)


@BOTH
@pytest.mark.parametrize(
    "make_env", [env_built_with_the_policy, serial_env_whose_children_track_init]
)
def test_what_the_env_already_writes_is_not_added_twice(collector_class: str, make_env) -> None:
    env = make_env()
    before = count_leaves(env.full_observation_spec, "recurrent_state")
    collector = make_collector(
        collector_class, env, gru_features(), auto_register_policy_transforms=True
    )
    try:
        spec = collector.env.full_observation_spec
        assert count_leaves(spec, "is_init") == 1
        assert count_leaves(spec, "recurrent_state") == 1
        if before:  # the env had everything: it is left as it is
            assert collector.env.transform is env.transform
    finally:
        collector.shutdown()


@BOTH
def test_default_none_warns_of_the_flip_and_fails_on_the_missing_flag(
    collector_class: str,
) -> None:
    with (
        pytest.warns(FutureWarning, match="auto_register_policy_transforms"),
        pytest.raises(KeyError, match="is_init"),
    ):
        make_collector(collector_class, torchrl_cartpole(), gru_features())


@BOTH
def test_false_is_silent_and_fails_on_the_missing_flag(collector_class: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        with pytest.raises(KeyError, match="is_init"):
            make_collector(
                collector_class,
                torchrl_cartpole(),
                gru_features(),
                auto_register_policy_transforms=False,
            )


def test_our_missing_flag_error_names_the_option() -> None:
    policy, _ = lstm_policy()
    with pytest.raises(KeyError, match=r"\['is_init'\].*auto_register_policy_transforms=True"):
        Collector(
            GymEnv("CartPole-v1"), policy, frames_per_batch=8, auto_register_policy_transforms=False
        )


def test_on_our_env_true_adds_our_init_tracker_and_none_warns() -> None:
    """Our envs get our `InitTracker` (no primer: the collector carries the state)."""
    policy, _ = lstm_policy()
    collector = Collector(
        GymEnv("CartPole-v1"), policy, frames_per_batch=8, auto_register_policy_transforms=True
    )
    batch = collector.next()
    assert bool(batch["is_init"][0].all())
    assert ("next", "recurrent_state_h") in batch.keys(include_nested=True)
    collector.shutdown()
    with (
        pytest.warns(FutureWarning, match=r"InitTracker.*auto_register_policy_transforms=True"),
        pytest.raises(KeyError, match="is_init"),
    ):
        Collector(GymEnv("CartPole-v1"), policy, frames_per_batch=8)


@pytest.mark.filterwarnings("ignore:the policy writes 'action' as")
def test_a_policy_needing_nothing_leaves_the_env_alone() -> None:
    """Unlike TorchRL 0.14, which appends an InitTracker (and warns under None) for any
    module on an env without one, only a policy that reads the flag gets it."""
    policy = torchrl_modules.MLP(in_features=4, out_features=2)
    wrapped = TensorDictModule(policy, ["observation"], ["action"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        collector = Collector(
            torchrl_cartpole(), wrapped, frames_per_batch=8, auto_register_policy_transforms=True
        )
    assert "is_init" not in collector.env.full_observation_spec
    collector.shutdown()

"""The methods of TorchRL's Collector page on the multi-process collectors, called as on
TorchRL's `MultiSyncCollector` / `MultiAsyncCollector`."""

from __future__ import annotations

import itertools

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

import rlcollect.collectors
from rlcollect.collectors import MultiAsyncCollector, MultiSyncCollector
from rlcollect.testing import CountingEnv
from tests.collectors.multiprocess.torchrl_side import run_torchrl, torchrl_cartpole
from tests.collectors.policies import greedy_module

torchrl_collectors = pytest.importorskip("torchrl.collectors")
torchrl_envs = pytest.importorskip("torchrl.envs")

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]


SEEDS = itertools.count()


def make_policy() -> TensorDictModule:
    """CartPole's greedy one-hot policy, with weights of its own."""
    return greedy_module(seed=next(SEEDS))


def counting_env() -> CountingEnv:
    return CountingEnv(episode_length=4)


@pytest.mark.parametrize("name", ["MultiSyncCollector", "MultiAsyncCollector"])
def test_frames_per_batch_worker_as_torchrl(name: str) -> None:
    arguments = {"num_workers": 2, "frames_per_batch": 30, "total_frames": 30}
    collector = getattr(rlcollect.collectors, name)(torchrl_cartpole, **arguments)
    try:
        ours = [collector.frames_per_batch_worker(worker_idx=i) for i in (None, 1)]
    finally:
        collector.shutdown(timeout=5.0, raise_on_error=True)
    assert ours == run_torchrl(name, **arguments)["frames_per_batch_worker"]


def test_versions_weights_and_models_on_a_multi_sync_collector() -> None:
    policy, trained = make_policy(), make_policy()
    with MultiSyncCollector(
        torchrl_cartpole, policy, num_workers=2, frames_per_batch=20, track_policy_version=True
    ) as collector:
        assert collector.get_policy_version() == 0
        assert collector.get_model("policy") is policy
        assert collector.getattr_policy("in_keys") == ["observation"]
        collector.update_policy_weights_(weights_dict={"policy": TensorDict.from_module(trained)})
        assert collector.get_policy_version() == 1
        cached = collector.get_cached_weights("policy")
        torch.testing.assert_close(
            cached["module", "linear", "weight"], trained.module.linear.weight
        )
        assert collector.get_cached_weights("value") is None
        assert int(collector.rollout()["next", "policy_version"].unique()) == 1
        collector.increment_version()
        assert collector.policy_version == 2
        collector.receive_weights(policy=make_policy())
        assert collector.policy_version == 3
        assert next(collector.iterator()).batch_size == (2, 10)
        assert collector.cascade_execute("frames_per_batch_worker", worker_idx=0) == 10
        # TorchRL's getattr_env: an attribute of the first worker's env, AttributeError if none
        spec = collector.getattr_env("action_spec")  # TorchRL's CartPole's, from worker 0
        assert (type(spec).__name__, spec.shape) == ("OneHot", (2,))
        with pytest.raises(AttributeError, match="no_such_attribute"):
            collector.getattr_env("no_such_attribute")
        assert collector.next().batch_size == (2, 10)  # the worker went on


def test_seed_reset_and_state_keyword_forms_on_a_multi_async_collector() -> None:
    with MultiAsyncCollector(
        [counting_env, counting_env], frames_per_batch=4, total_frames=-1, compact_obs=True
    ) as collector:
        assert collector.set_seed(7, static_seed=True) == 7
        assert [slot.seed for slot in collector.pool.slots] == [7, 7]
        assert collector.set_seed(7) == 9
        batch_keys = set(collector.next().keys(include_nested=True, leaves_only=True))
        # TorchRL's keys: no worker id unless asked for; with compact_obs, no next observation
        assert ("collector", "worker_id") not in batch_keys
        assert ("next", "observation") not in batch_keys
        assert ("next", "reward") in batch_keys
        collector.reset(index=[False, True])
        collector.reset(index=0)
        collector.reset()
        with pytest.raises(ValueError, match=r"reset names workers \[2\]; .* workers 0\.\.1"):
            collector.reset(index=2)
        with pytest.raises(ValueError, match="a mask of 3 flags; this collector has 2 workers"):
            collector.reset(index=[True, False, True])
        collector.load_state_dict(state_dict=collector.state_dict())
    collector.shutdown(timeout=1.0, raise_on_error=False)  # idempotent


def test_track_worker_id_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="track_worker_id must be True or False; got 1"):
        MultiAsyncCollector(counting_env, frames_per_batch=4, track_worker_id=1)

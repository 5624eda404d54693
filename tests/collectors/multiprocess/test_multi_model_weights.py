"""`update_policy_weights_(weights_dict=..., model_id=...)` for models other than the policy: a
value network inside a TorchRL env transform, updated with (or without) the policy, in a
`Collector` (in place, by attribute path) and in every worker of the multi-process collectors
(each acknowledges before the call returns), checked against the model before anything is sent.
The Ray collector's actors do the same (tests/collectors/ray/test_ray_model_weights.py).

TorchRL 0.14.1 is run beside ours where it has the feature: its single `Collector` without
schemes refuses another model id with KeyError and leaves a `weights_dict` of other models
unapplied (ours loads them), and both refuse `weights_dict` together with `model_id`. Its
multi-process collectors resolve a model id on the parent too, where no env lives, so
`"env.transform[0].module"` stops their constructor (`'MultiSyncCollector' object has no
attribute 'env'`): that side is ours alone.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.collectors import Collector as TorchRLCollector
from torchrl.weight_update import MultiProcessWeightSyncScheme

from rlcollect import Collector
from rlcollect.collectors import MultiAsyncCollector, MultiSyncCollector
from tests.collectors.multiprocess.value_network import VALUE, always_right, make_env, value_net
from tests.collectors.policies import greedy_module


def test_collector_loads_the_value_network_and_the_policy_in_place() -> None:
    theirs = TorchRLCollector(make_env, greedy_module(), frames_per_batch=8, total_frames=-1)
    ours = Collector(make_env, greedy_module(), frames_per_batch=8, total_frames=-1)
    try:
        with pytest.raises(KeyError, match=r"no local weight target for model_id='env"):
            theirs.update_policy_weights_(value_net(7.0), model_id=VALUE)
        theirs.update_policy_weights_(weights_dict={VALUE: value_net(7.0)})  # no scheme: ignored
        assert not (theirs.next()["next", "value"] == 7).any()
        for collector in (theirs, ours):
            with pytest.raises(ValueError, match=r"weights_dict.*model_id"):
                collector.update_policy_weights_(weights_dict={VALUE: {}}, model_id=VALUE)
        assert not (ours.next()["next", "value"] == 7).any()
        ours.update_policy_weights_(weights_dict={VALUE: value_net(7.0), "policy": always_right()})
        batch = ours.next()
        assert (batch["next", "value"] == 7).all()
        assert (batch["action"].argmax(-1) == 1).all()
        assert ours.policy_version == 1  # the policy's updates are counted, the others' not
        ours.update_policy_weights_(TensorDict.from_module(value_net(-2.0)), model_id=VALUE)
        assert (ours.next()["next", "value"] == -2).all()
        assert ours.policy_version == 1
    finally:
        theirs.shutdown()
        ours.shutdown()


def test_collector_refuses_unknown_model_ids_and_wrong_weights() -> None:
    with Collector(make_env, greedy_module(), frames_per_batch=8, total_frames=-1) as collector:
        with pytest.raises(KeyError, match=r"'env.transform\[3\].module'.*3 does not exist"):
            collector.update_policy_weights_(weights_dict={"env.transform[3].module": {}})
        with pytest.raises(KeyError, match=r"'env.critic'.*'critic' does not exist on Transformed"):
            collector.update_policy_weights_(value_net(), model_id="env.critic")
        with pytest.raises(TypeError, match=r"'env.batch_size' names a Size, not an nn.Module"):
            collector.update_policy_weights_(value_net(), model_id="env.batch_size")
        with pytest.raises(ValueError, match=r"no weights for model 'env.transform\[0\].module'"):
            collector.update_policy_weights_(model_id=VALUE)
        wrong = {"weight": torch.zeros(2, 4), "bias": torch.zeros(2)}
        with pytest.raises(ValueError, match=r"model 'env.transform\[0\].module' has shape"):
            collector.update_policy_weights_(weights_dict={VALUE: wrong})
        assert not (collector.next()["next", "value"] == 7).any()  # nothing was loaded


def test_model_ids_name_the_users_env_under_the_step_limit() -> None:
    """With `max_frames_per_traj` the collector steps its step limit around the user's env;
    `"env.transform[0].module"` still names the user's transform's module, for `get_model`
    and for updates, as in TorchRL (whose StepCounter is appended after the user's)."""
    env = make_env()
    theirs = TorchRLCollector(make_env(), None, frames_per_batch=8, max_frames_per_traj=5)
    with Collector(env, greedy_module(), frames_per_batch=8, max_frames_per_traj=5) as ours:
        assert ours.get_model(VALUE) is env.transform[0].module
        assert type(theirs.get_model(VALUE)) is type(ours.get_model(VALUE))
        ours.update_policy_weights_(weights_dict={VALUE: value_net(7.0)})
        batch = ours.next()
        assert (batch["next", "value"] == 7).all()
        assert int(batch["next", "step_count"].max()) == 5
    theirs.shutdown()


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children")
def test_workers_resolve_model_ids_under_the_step_limit() -> None:
    with MultiSyncCollector(
        [make_env, make_env], greedy_module(), frames_per_batch=8, max_frames_per_traj=5
    ) as collector:
        collector.update_policy_weights_(weights_dict={VALUE: value_net(7.0)})
        assert (collector.next()["next", "value"] == 7).all()


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
@pytest.mark.parametrize("collector_class", [MultiSyncCollector, MultiAsyncCollector])
def test_every_worker_applies_the_value_network_and_policy_before_the_call_returns(
    collector_class: type,
) -> None:
    # TorchRL's way: a scheme of its own per model id, accepted (the weights travel by pipe).
    schemes = {VALUE: MultiProcessWeightSyncScheme()}
    with collector_class(
        [make_env, make_env],
        greedy_module(),
        frames_per_batch=8,
        total_frames=-1,
        weight_sync_schemes=schemes,
    ) as collector:
        assert not (collector.next()["next", "value"] == 7).any()
        update = {VALUE: value_net(7.0), "policy": always_right()}
        collector.update_policy_weights_(weights_dict=update)
        with pytest.raises(KeyError, match=r"'env.transform\[3\].module'.*3 does not exist"):
            collector.update_policy_weights_(weights_dict={"env.transform[3].module": {}})
        wrong = {"weight": torch.zeros(2, 4), "bias": torch.zeros(1)}
        with pytest.raises(ValueError, match=r"model 'env.transform\[0\].module' has shape"):
            collector.update_policy_weights_(weights_dict={VALUE: wrong})
        # MultiAsync: the batch each worker had on its way was collected before the call.
        in_flight = 2 if collector_class is MultiAsyncCollector else 0
        batches = [collector.next() for _ in range(in_flight + 2)][in_flight:]
        for batch in batches:
            assert (batch["next", "value"] == 7).all()
            assert (batch["action"].argmax(-1) == 1).all()
        assert collector.policy_version == 1

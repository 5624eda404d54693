"""`RayCollector.update_policy_weights_(weights_dict=...)` for a model other than the policy
(a value network inside a TorchRL env transform): every actor loads it between two batches
before the call returns, and a model id or weights that do not fit are raised in the driver,
the actors going on."""

from __future__ import annotations

import pytest

from rlcollect.collectors import RayCollector
from tests.collectors.multiprocess.value_network import (
    VALUE,
    always_right,
    make_env,
    value_net,
)
from tests.collectors.policies import greedy_module
from tests.collectors.ray.helpers import RAY_TEST_TIMEOUT, REPORT_SECONDS, actor_handles
from tests.conftest import processes_gone

ray = pytest.importorskip("ray")


pytestmark = [
    pytest.mark.timeout(RAY_TEST_TIMEOUT),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]


@pytest.mark.slow
def test_every_actor_applies_the_value_network_before_the_call_returns() -> None:
    with RayCollector(
        [make_env, make_env], greedy_module(), frames_per_batch=16, total_frames=-1
    ) as collector:
        assert not (collector.next()["next", "value"] == 7).any()
        collector.update_policy_weights_(
            weights_dict={VALUE: value_net(7.0), "policy": always_right()}
        )
        batch = collector.next()
        assert (batch["next", "value"] == 7).all()  # both actors' halves
        assert (batch["action"].argmax(-1) == 1).all()
        assert collector.policy_version == 1
        with pytest.raises(KeyError, match=r"'env.transform\[3\].module'.*3 does not exist"):
            collector.update_policy_weights_(weights_dict={"env.transform[3].module": {}})
        wrong = {"weight": value_net().module.weight[:0], "bias": value_net().module.bias}
        with pytest.raises(ValueError, match=r"model 'env.transform\[0\].module'"):
            collector.update_policy_weights_(weights_dict={VALUE: wrong})
        assert (collector.next()["next", "value"] == 7).all()  # the actors went on


@pytest.mark.slow
def test_an_actor_ray_restarts_loads_the_models_weights_again() -> None:
    with RayCollector(
        [make_env, make_env],
        greedy_module(),
        frames_per_batch=16,
        total_frames=-1,
        restart_dead_collectors=True,
    ) as collector:
        collector.update_policy_weights_(weights_dict={VALUE: value_net(7.0)})
        assert (collector.next()["next", "value"] == 7).all()
        pid = collector.stats()["collectors"][1]["pid"]
        ray.kill(actor_handles(collector)[1], no_restart=False)
        assert processes_gone([pid], REPORT_SECONDS)
        batch = collector.next()  # actor 1 comes back within the batch
        assert collector.stats()["collectors"][1]["restarts"] == 1
        assert (batch["next", "value"] == 7).all(), "the restarted actor has the value network"

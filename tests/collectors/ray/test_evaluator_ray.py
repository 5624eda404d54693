"""`Evaluator(backend="ray")` on the session's local Ray cluster: episodes played in an actor
with the weights sent, its errors reported with its traceback, the actor ended at shutdown."""

from __future__ import annotations

import os

import pytest

from rlcollect.collectors import ActorError, Evaluator
from tests.collectors.evaluation.parts import (
    counting_env,
    raising_env,
    sign_policy,
    sign_policy_factory,
    where_and_what,
)
from tests.collectors.ray.helpers import RAY_TEST_TIMEOUT
from tests.conftest import processes_gone

ray = pytest.importorskip("ray")

pytestmark = [
    pytest.mark.timeout(RAY_TEST_TIMEOUT),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]


def ray_evaluator(env_factory: object = None, **options: object) -> Evaluator:
    options = {
        "policy_factory": sign_policy_factory,
        "num_trajectories": 2,
        "backend": "ray",
        "num_gpus": 0,
        "metrics_fn": where_and_what,
        "collector_kwargs": {"traj_format": "cat"},
        **options,
    }
    return Evaluator(env_factory or counting_env(), **options)


def test_episodes_are_played_in_an_actor_with_the_weights_sent() -> None:
    with ray_evaluator() as evaluator:
        result = evaluator.evaluate(step=2)
        actor = int(result["eval/pid"])
        assert actor != os.getpid()
        assert (result["eval/num_episodes"], result["eval/reward"], result["eval/step"]) == (
            2,
            5.0,
            2,
        )
        assert result["eval/action"] == 0.0
        assert evaluator.trigger_eval(sign_policy(1.0), step=3)
        result = evaluator.wait(timeout=120)
        assert (result["eval/action"], result["eval/step"], int(result["eval/pid"])) == (
            1.0,
            3,
            actor,
        )
        with pytest.raises(ValueError, match=r"missing keys \['module.weight'\]"):
            evaluator.evaluate({"bias": sign_policy().module.weight})
    assert processes_gone([actor], within=15), "shutdown ends the actor"


def test_an_error_in_the_actor_is_raised_with_its_traceback() -> None:
    with ray_evaluator(raising_env(4)) as evaluator:
        with pytest.raises(ActorError, match="evaluate raised RuntimeError") as info:
            evaluator.evaluate()
        assert "the evaluation env broke at step 4" in str(info.value)
        assert "parts.py" in info.value.remote_traceback


def test_gpus_the_cluster_lacks_are_refused_naming_the_fix() -> None:
    evaluator = ray_evaluator(num_gpus=1)
    with evaluator, pytest.raises(ValueError, match="pass num_gpus=0 to evaluate on CPUs"):
        evaluator.evaluate()

"""`Evaluator` in this process (backend "thread"): metrics of whole episodes, weights, the
background thread and its busy policies, results and errors, transforms, checkpoints."""

from __future__ import annotations

import logging
import math
import threading
import time

import pytest
import torch
from tensordict import TensorDictBase

from rlcollect import GymEnv
from rlcollect.collectors import Evaluator
from rlcollect.testing import CountingEnv
from tests.collectors.evaluation.parts import (
    gated_policy,
    raising_env,
    recorded_env,
    sign_policy,
    sign_policy_factory,
    slow_policy_factory,
    where_and_what,
)

pytestmark = pytest.mark.timeout(120)
CAT = {"traj_format": "cat"}


def CARTPOLE() -> GymEnv:  # noqa: N802
    return GymEnv("CartPole-v1", categorical_action_encoding=True)


def evaluator_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "rlcollect-evaluator" and t.is_alive()]


# --- metrics of whole episodes ------------------------------------------------------------------


def test_evaluate_measures_whole_episodes() -> None:
    evaluator = Evaluator(CountingEnv(episode_length=5), sign_policy(), num_trajectories=3)
    with evaluator:
        result = evaluator.evaluate(step=7)
    assert result["eval/num_episodes"] == 3
    assert result["eval/reward"] == 5.0  # reward 1 per step, 5 steps
    assert result["eval/reward_std"] == 0.0
    assert result["eval/episode_length"] == 5.0
    assert result["eval/step"] == 7
    assert result["eval/fps"] > 0
    assert set(result) == {
        "eval/reward",
        "eval/reward_std",
        "eval/num_episodes",
        "eval/episode_length",
        "eval/fps",
        "eval/step",
    }


def test_max_steps_truncates_episodes_and_a_batched_env_gives_exactly_the_count() -> None:
    env = CountingEnv(episode_length=100, batch_size=(4,))
    with Evaluator(env, sign_policy(), num_trajectories=6, max_steps=7) as evaluator:
        result = evaluator.evaluate()
    assert result["eval/num_episodes"] == 6
    assert result["eval/episode_length"] == 7.0
    assert result["eval/reward"] == 7.0


def test_every_evaluation_starts_from_a_reset_and_measures_only_its_own_episodes() -> None:
    """Episodes running when an evaluation has its count are dropped, not carried over: with
    4 sub-envs of length 5 and 6 episodes wanted, every evaluation measures 6 episodes of 5
    steps each (a carried-over remainder would be shorter)."""
    env = CountingEnv(episode_length=5, batch_size=(4,))
    with Evaluator(env, sign_policy(), num_trajectories=6, frames_per_batch=12) as evaluator:
        for step in range(3):
            result = evaluator.evaluate(step=step)
            assert (result["eval/num_episodes"], result["eval/episode_length"]) == (6, 5.0)


def test_log_prefix_metrics_fn_and_steps_counted_when_not_given() -> None:
    evaluator = Evaluator(
        CountingEnv(episode_length=3),
        sign_policy(1.0),
        num_trajectories=2,
        log_prefix="greedy",
        metrics_fn=where_and_what,
        collector_kwargs=CAT,
    )
    with evaluator:
        first, second = evaluator.evaluate(), evaluator.evaluate()
    assert first["greedy/action"] == 1.0
    assert (first["greedy/step"], second["greedy/step"]) == (0, 1)


def test_a_real_gymnasium_env_with_a_return_of_its_own() -> None:
    """CartPole: episodes end when the pole falls; a policy that always pushes one way
    loses it within a few dozen steps, and every step pays 1."""
    with Evaluator(CARTPOLE(), sign_policy(1.0), num_trajectories=4) as evaluator:
        result = evaluator.evaluate()
    assert result["eval/num_episodes"] == 4
    assert 5 <= result["eval/episode_length"] < 60
    assert result["eval/reward"] == result["eval/episode_length"]


def test_no_episode_ends_within_max_steps_is_impossible_so_nan_never_shows() -> None:
    with Evaluator(CountingEnv(episode_length=10**6), sign_policy(), max_steps=4) as evaluator:
        result = evaluator.evaluate()
    assert not math.isnan(result["eval/reward"])
    assert result["eval/episode_length"] == 4.0


# --- weights ------------------------------------------------------------------------------------


def test_weights_are_loaded_before_the_episodes_and_stay_loaded() -> None:
    evaluator = Evaluator(
        CountingEnv(), sign_policy(-1.0), metrics_fn=where_and_what, collector_kwargs=CAT
    )
    with evaluator:
        assert evaluator.evaluate()["eval/action"] == 0.0
        assert evaluator.evaluate(sign_policy(1.0))["eval/action"] == 1.0
        assert evaluator.evaluate()["eval/action"] == 1.0
        weights = Evaluator.extract_weights(sign_policy(-1.0))
        assert evaluator.evaluate(weights_dict={"policy": weights})["eval/action"] == 0.0


def test_background_weights_are_copied_when_triggered() -> None:
    """An optimiser step after `trigger_eval()` does not reach the evaluation."""
    gate = threading.Event()
    evaluator = Evaluator(
        CountingEnv(),
        gated_policy(gate),
        metrics_fn=where_and_what,
        collector_kwargs=CAT,
        num_trajectories=1,
    )
    train = sign_policy(1.0)
    with evaluator:
        assert evaluator.trigger_eval(train, step=3)
        with torch.no_grad():
            train.module.weight.fill_(-1.0)
        gate.set()
        result = evaluator.wait(timeout=60)
    assert result is not None
    assert result["eval/action"] == 1.0


def test_bad_weights_are_refused_naming_the_key() -> None:
    with Evaluator(CountingEnv(), sign_policy()) as evaluator:
        with pytest.raises(ValueError, match=r"missing keys \['module.weight'\]"):
            evaluator.evaluate({"bias": torch.zeros(1)})
        with pytest.raises(TypeError, match=r"weights must be an nn\.Module, a TensorDict"):
            evaluator.evaluate(weights=3.0)


# --- in the background --------------------------------------------------------------------------


def test_trigger_eval_runs_in_the_background_and_pending_follows_it() -> None:
    gate = threading.Event()
    evaluator = Evaluator(CountingEnv(), gated_policy(gate), num_trajectories=1)
    with evaluator:
        assert not evaluator.pending
        assert evaluator.wait(timeout=0.1) is None  # nothing pending: no wait
        assert evaluator.trigger_eval(step=11)
        assert evaluator.pending
        assert evaluator.poll() is None
        gate.set()
        result = evaluator.wait(timeout=60)
        assert result is not None
        assert result["eval/step"] == 11
        assert not evaluator.pending
        assert evaluator.poll() is None


def test_busy_policy_skip_error_and_queue() -> None:
    gate = threading.Event()
    with Evaluator(CountingEnv(), gated_policy(gate), num_trajectories=1) as skipping:
        assert skipping.trigger_eval(step=0)
        assert not skipping.trigger_eval(step=1)
        gate.set()
        assert skipping.wait(timeout=60)["eval/step"] == 0
        assert skipping.trigger_eval(step=2)
        assert skipping.wait(timeout=60)["eval/step"] == 2
    gate.clear()
    with Evaluator(
        CountingEnv(), gated_policy(gate), num_trajectories=1, busy_policy="error"
    ) as strict:
        assert strict.trigger_eval(step=0)
        with pytest.raises(RuntimeError, match="an evaluation is already pending"):
            strict.trigger_eval(step=1)
        gate.set()
        assert strict.wait(timeout=60)["eval/step"] == 0
    gate.clear()
    evaluator = Evaluator(
        CountingEnv(),
        gated_policy(gate),
        num_trajectories=1,
        busy_policy="queue",
        metrics_fn=where_and_what,
        collector_kwargs=CAT,
    )
    with evaluator:
        assert evaluator.trigger_eval(sign_policy(1.0), step=0)
        assert evaluator.trigger_eval(sign_policy(-1.0), step=1)
        gate.set()
        first, second = evaluator.wait(timeout=60), evaluator.wait(timeout=60)
        assert (first["eval/step"], first["eval/action"]) == (0, 1.0)
        assert (second["eval/step"], second["eval/action"]) == (1, 0.0)
        assert evaluator.wait(timeout=1) is None


def test_on_result_gets_every_result_as_a_tensordict_and_its_errors_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[TensorDictBase] = []

    def on_result(result: TensorDictBase) -> None:
        seen.append(result)
        raise ValueError("the logger is down")

    evaluator = Evaluator(CountingEnv(), sign_policy(), num_trajectories=1, on_result=on_result)
    with evaluator, caplog.at_level(logging.WARNING):
        evaluator.evaluate(step=5)
        evaluator.trigger_eval(step=6)
        assert evaluator.wait(timeout=60)["eval/step"] == 6
    assert [int(result["eval/step"]) for result in seen] == [5, 6]
    assert float(seen[0]["eval/reward"]) == 5.0
    assert "on_result callback failed" in caplog.text


def test_a_failed_background_evaluation_raises_in_wait_and_the_next_one_runs() -> None:
    evaluator = Evaluator(raising_env(3), policy_factory=sign_policy_factory, num_trajectories=1)
    with evaluator:
        evaluator.trigger_eval(step=0)
        with pytest.raises(RuntimeError, match="the evaluation env broke at step 3"):
            evaluator.wait(timeout=60)
        assert not evaluator.pending
        with pytest.raises(RuntimeError, match="the evaluation env broke at step"):
            evaluator.evaluate()


def test_factories_are_built_by_the_first_evaluation_in_its_thread() -> None:
    built_in: list[str] = []

    def env_factory() -> CountingEnv:
        built_in.append(threading.current_thread().name)
        return CountingEnv()

    evaluator = Evaluator(env_factory, policy_factory=sign_policy_factory, num_trajectories=1)
    with evaluator:
        assert built_in == []
        evaluator.trigger_eval()
        assert evaluator.wait(timeout=60) is not None
    assert built_in == ["rlcollect-evaluator"]


def test_shutdown_ends_an_evaluation_in_flight_promptly_and_leaves_no_thread() -> None:
    evaluator = Evaluator(
        lambda: CountingEnv(episode_length=10**6),
        policy_factory=slow_policy_factory,
        num_trajectories=1,
    )
    evaluator.trigger_eval()
    time.sleep(0.5)
    assert evaluator.pending
    started = time.monotonic()
    evaluator.shutdown(timeout=10)
    assert time.monotonic() - started < 3
    assert not evaluator.pending
    assert evaluator_threads() == []
    with pytest.raises(RuntimeError, match="after shutdown"):
        evaluator.trigger_eval()


# --- the env's transforms -----------------------------------------------------------------------


def test_running_statistics_are_frozen_and_recorders_dumped_at_each_step() -> None:
    env = recorded_env()
    recorder = env.transform[0]
    with Evaluator(env, sign_policy(), num_trajectories=1) as evaluator:
        assert recorder.frozen
        evaluator.evaluate(step=10)
        evaluator.evaluate(step=20)
    assert recorder.dumps == [10, 20]
    env = recorded_env()
    with Evaluator(env, sign_policy(), num_trajectories=1, dump_video=False) as evaluator:
        evaluator.evaluate(step=10)
    assert env.transform[0].dumps == []


# --- checkpoints --------------------------------------------------------------------------------


def test_state_dict_carries_the_step_counter_and_refuses_while_results_are_unread() -> None:
    with Evaluator(CountingEnv(), sign_policy(), num_trajectories=1) as evaluator:
        evaluator.evaluate()
        evaluator.evaluate()
        state = evaluator.state_dict()
        evaluator.trigger_eval()
        with pytest.raises(RuntimeError, match="pending, queued, or unread"):
            evaluator.state_dict()
        evaluator.wait(timeout=60)
    with Evaluator(CountingEnv(), sign_policy(), num_trajectories=1) as restored:
        restored.load_state_dict(state)
        assert restored.evaluate()["eval/step"] == 2


# --- arguments ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"backend": "gpu"}, ValueError, r"Unknown backend 'gpu'; choose one of"),
        ({"busy_policy": "replace"}, ValueError, r"Unknown busy_policy 'replace'"),
        ({"policy_factory": sign_policy_factory}, ValueError, "not both"),
        ({"policy": None}, ValueError, "A policy or a policy_factory must be provided"),
        ({"collector_cls": "MultiSyncCollector"}, ValueError, "leave collector_cls unset"),
        ({"num_trajectories": 0}, ValueError, "num_trajectories must be a positive integer"),
        ({"max_steps": -1}, ValueError, "max_steps must be a positive integer or None"),
        (
            {"collector_kwargs": {"frames_per_batch": 3}},
            ValueError,
            r"collector_kwargs sets \['frames_per_batch'\], which the Evaluator sets itself",
        ),
        (
            {"collector_kwargs": {"traj_format": "nested"}},
            ValueError,
            "traj_format'\\] must be one of",
        ),
        ({"backend": "process"}, ValueError, "needs `env` to be a callable"),
        ({"backend": "ray"}, ValueError, "needs `env` to be a callable"),
    ],
)
def test_arguments_are_checked_at_construction(
    arguments: dict, error: type[Exception], message: str
) -> None:
    options = {"policy": sign_policy(), **arguments}
    with pytest.raises(error, match=message):
        Evaluator(CountingEnv(), **options)


def test_process_and_ray_need_a_policy_factory() -> None:
    for backend in ("process", "ray"):
        with pytest.raises(ValueError, match="needs `policy_factory`"):
            Evaluator(CountingEnv, sign_policy(), backend=backend)


def first_state(batch: TensorDictBase) -> dict[str, float]:
    return {"first": float(batch.get("observation")[0].sum())}


def test_a_seed_replays_the_same_episodes_at_every_evaluation() -> None:
    """CartPole's first states are drawn at reset: with `seed`, every evaluation starts from
    the same one; without, the env's generator goes on and each starts elsewhere."""
    options = {"num_trajectories": 2, "metrics_fn": first_state, "collector_kwargs": CAT}
    with Evaluator(CARTPOLE(), sign_policy(1.0), seed=11, **options) as seeded:
        firsts = {seeded.evaluate()["eval/first"] for _ in range(3)}
    assert len(firsts) == 1
    env = CARTPOLE()
    env.set_seed(11)  # once: the generator then goes on from evaluation to evaluation
    with Evaluator(env, sign_policy(1.0), **options) as free:
        firsts = {free.evaluate()["eval/first"] for _ in range(3)}
    assert len(firsts) == 3

"""`Evaluator(backend="process")`: evaluations in a real worker process, weights sent there,
its failures reported with its traceback, and nothing left behind."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from tensordict import TensorDictBase

from rlcollect.collectors import Evaluator, SharedMemWeightSyncScheme
from rlcollect.errors import WorkerError, WorkerRaisedError
from tests.collectors.evaluation.parts import (
    counting_env,
    dying_env,
    init_seen,
    mark_init,
    raising_env,
    recorded_env,
    sign_policy,
    sign_policy_factory,
    slow_policy_factory,
    slowly_built_env,
    where_and_what,
)
from tests.collectors.multiprocess.shared_board import (
    BOARD,
    PARENT_SLOT,
    board_makers,
    shared_board,
)
from tests.conftest import processes_gone

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]
CAT = {"traj_format": "cat"}


def process_evaluator(env_factory: object = None, **options: object) -> Evaluator:
    options = {
        "policy_factory": sign_policy_factory,
        "num_trajectories": 2,
        "backend": "process",
        "metrics_fn": where_and_what,
        "collector_kwargs": CAT,
        **options,
    }
    return Evaluator(env_factory or counting_env(), **options)


def test_episodes_are_played_in_a_worker_process_with_the_weights_sent() -> None:
    with process_evaluator() as evaluator:
        result = evaluator.evaluate(step=4)
        worker = int(result["eval/pid"])
        assert worker != os.getpid()
        assert (result["eval/num_episodes"], result["eval/reward"], result["eval/step"]) == (
            2,
            5.0,
            4,
        )
        assert result["eval/action"] == 0.0  # the factory's weights
        assert evaluator.evaluate(sign_policy(1.0))["eval/action"] == 1.0
        assert evaluator.trigger_eval(step=9)  # the weights sent stay
        result = evaluator.wait(timeout=120)
        assert (result["eval/action"], result["eval/step"]) == (1.0, 9)
        assert int(result["eval/pid"]) == worker  # one worker serves every evaluation
    assert processes_gone([worker], within=10)


def test_weights_travel_by_a_shared_memory_scheme_too() -> None:
    scheme = SharedMemWeightSyncScheme()
    with process_evaluator(weight_sync_schemes={"policy": scheme}) as evaluator:
        assert evaluator.evaluate(sign_policy(1.0))["eval/action"] == 1.0
        assert evaluator.evaluate(sign_policy(-1.0))["eval/action"] == 0.0


def test_weights_are_checked_before_they_are_sent() -> None:
    with process_evaluator() as evaluator:
        with pytest.raises(ValueError, match=r"missing keys \['module.weight'\]"):
            evaluator.evaluate({"bias": sign_policy().module.weight})
        assert evaluator.evaluate()["eval/num_episodes"] == 2  # the worker goes on


def test_a_policy_without_weights_refuses_weights() -> None:
    with process_evaluator(policy_factory=lambda: None, metrics_fn=None) as evaluator:
        assert evaluator.evaluate()["eval/num_episodes"] == 2  # random actions
        with pytest.raises(TypeError, match=r"requires an nn\.Module policy"):
            evaluator.evaluate(sign_policy(1.0))


def test_init_fn_runs_first_in_the_worker() -> None:
    with process_evaluator(init_fn=mark_init, metrics_fn=init_seen) as evaluator:
        result = evaluator.evaluate()
    assert result["eval/init_pid"] not in (-1.0, float(os.getpid()))


def test_recorders_are_dumped_in_the_worker(tmp_path: Path) -> None:
    log = tmp_path / "dumps"
    env_factory = lambda: recorded_env(str(log))  # noqa: E731  # travels with cloudpickle
    with process_evaluator(env_factory, metrics_fn=where_and_what) as evaluator:
        worker = int(evaluator.evaluate(step=3)["eval/pid"])
        evaluator.evaluate(step=8)
    assert log.read_text().split("\n")[:2] == [f"3 {worker}", f"8 {worker}"]


def test_an_error_in_the_worker_is_raised_with_its_traceback() -> None:
    with process_evaluator(raising_env(4)) as evaluator:
        with pytest.raises(WorkerRaisedError, match="an evaluation \\(step 0\\) raised") as info:
            evaluator.evaluate(step=0)
        assert "the evaluation env broke at step 4" in str(info.value)
        assert "--- traceback in worker 0 ---" in str(info.value)
        evaluator.trigger_eval(step=1)
        with pytest.raises(WorkerRaisedError, match="the evaluation env broke"):
            evaluator.wait(timeout=120)
        assert not evaluator.pending


def test_a_worker_that_dies_is_reported_and_the_next_evaluation_starts_a_fresh_one() -> None:
    with process_evaluator(dying_env(3)) as evaluator:
        started = time.monotonic()
        with pytest.raises(WorkerError, match=r"died \(exit code 3\) during an evaluation"):
            evaluator.evaluate()
        assert time.monotonic() - started < 30
        with pytest.raises(WorkerError, match=r"died \(exit code 3\)"):
            evaluator.evaluate()  # a fresh worker, which dies the same way


def test_a_build_error_names_the_worker_and_the_cause() -> None:
    def broken_env() -> None:
        raise OSError("no display")

    evaluator = process_evaluator(broken_env)
    failed = pytest.raises(WorkerRaisedError, match="building the evaluation env and policy")
    with evaluator, failed:
        evaluator.evaluate()


def test_shutdown_ends_an_evaluation_in_flight_within_its_timeout() -> None:
    evaluator = process_evaluator(
        counting_env(episode_length=10**6), policy_factory=slow_policy_factory, metrics_fn=None
    )
    evaluator.trigger_eval()
    time.sleep(3)
    assert evaluator.pending
    started = time.monotonic()
    evaluator.shutdown(timeout=5)
    assert time.monotonic() - started < 8
    assert not evaluator.pending


def test_shutdown_ends_a_worker_still_building_its_env_within_its_timeout() -> None:
    evaluator = process_evaluator(slowly_built_env, metrics_fn=None)
    evaluator.trigger_eval()
    time.sleep(1)
    started = time.monotonic()
    evaluator.shutdown(timeout=3)
    assert time.monotonic() - started < 6


def board_seen(batch: TensorDictBase) -> dict[str, float]:
    """The least the worker's env read in this process's slot of the board."""
    return {"parent_slot": float(batch["next", BOARD][..., PARENT_SLOT].min())}


def test_an_env_factorys_shared_tensors_are_shared_with_the_worker() -> None:
    board = shared_board(1)
    (maker,) = board_makers(board)
    with process_evaluator(maker, metrics_fn=board_seen) as evaluator:
        assert evaluator.evaluate(step=0)["eval/parent_slot"] == 0.0
        tallied = float(board[0])
        assert tallied >= 10  # the worker's two episodes: its writes reached this process
        board[PARENT_SLOT] = 7.0  # after the worker started
        assert evaluator.evaluate(step=1)["eval/parent_slot"] == 7.0
    assert float(board[0]) > tallied

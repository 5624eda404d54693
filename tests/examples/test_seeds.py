"""`seed=` makes a run repeatable: two runs of a tiny config with the same seed write the same
metrics, row for row, the clock's columns aside, for DQN (with `dqn.background=false`: its
background collector's timing decides the interleaving of collection and learning otherwise)
and MAPPO. PPO's and SAC's own tests check theirs; collect.py and ppo_rollout_buffer.py share
PPO's seeding (checked by hand: two runs each gave the same rows)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.examples import dqn_runs, mappo_runs
from tests.examples.metrics_rows import metrics, without_clock
from tests.examples.script_runner import check_succeeded, run_script

RUNS = {
    "dqn": (
        *dqn_runs.TINY,
        "dqn.background=false",
        "collector.total_frames=1024",
        "eval_episodes=0",
    ),
    "mappo": (*mappo_runs.TINY, "collector.total_frames=300", "eval_episodes=0"),
}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("script", sorted(RUNS))
def test_the_same_seed_writes_the_same_metrics(script: str, tmp_path: Path) -> None:
    runs = []
    for name in ("first", "second"):
        result = run_script(script, tmp_path / name, *RUNS[script], "seed=3")
        check_succeeded(result)
        runs.append(without_clock(metrics(tmp_path / name)))
    assert len(runs[0]) >= 2, runs[0]
    assert runs[0] == runs[1]

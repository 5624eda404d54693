"""Benchmark scripts run end to end in their quick mode (numbers are not asserted), each as
`python benchmarks/<script>.py` runs it, in a child of the script zygote
(tests/examples/script_runner.py: an interpreter that imported torch once); the ones that
measure each implementation in a fresh interpreter run with `--in-process` here, one interpreter
for all (a fresh interpreter costs about 6 s of CPU: the suite's time, not what the smoke run
checks)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.examples.script_runner import zygote
from tests.ray_session import SUBPROCESS_ENV

ROOT = Path(__file__).resolve().parents[1]


def run(script: str, *arguments: str, env: dict[str, str] | None = None) -> str:
    """Run a benchmark script (with `env` added to the environment); a Ray cluster it starts
    runs its workers at nice 0, as the test run's does (Ray's nice 15 starved them on a busy
    machine: tests/ray_session.py)."""
    argv = [str(ROOT / "benchmarks" / script), *arguments]
    done = zygote().run(argv, {**os.environ, **SUBPROCESS_ENV, **(env or {})}, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_env_benchmark_quick() -> None:
    output = run("envs.py", "--quick")
    assert "SerialEnv(8)" in output


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_collector_benchmark_quick() -> None:
    output = run(
        "collectors.py", "--quick", "--in-process", "--only", "CartPole single", "--frames", "2000"
    )
    assert "rlcollect / torchrl" in output
    assert "rlcollect / gym" in output
    assert "FAILED" not in output


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_multi_collector_benchmark_quick() -> None:
    output = run(
        "multi_collectors.py",
        *("--quick", "--in-process", "--only", "2x1 rlcollect", "2x1 torchrl", "update"),
    )
    assert "rlcollect / torchrl" in output
    assert "update_s" in output
    assert "FAILED" not in output


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_multi_agent_benchmark_quick() -> None:
    pytest.importorskip("mpe2")
    output = run("multi_agent.py", "--quick", "--in-process")
    assert "rlcollect / torchrl" in output
    assert "FAILED" not in output


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_views_benchmark_quick() -> None:
    output = run("views.py", "--quick")
    assert "cost against no views" in output
    assert "FAILED" not in output


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_store_obs_once_benchmark_quick() -> None:
    output = run("store_obs_once.py", "--quick", "--frames", "1000")
    assert "compact / standard" in output
    assert "compact bytes / standard bytes" in output


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ray_collector_benchmark_quick(ray_cluster: str) -> None:
    """On the test run's cluster (its actors forked from the preloaded zygote)."""
    output = run(
        "ray_collectors.py",
        *("--quick", "--in-process", "--only", "ray rlcollect", "object store"),
        env={"RAY_ADDRESS": ray_cluster},
    )
    assert "rlcollect-ray" in output
    assert "overhead_ms=" in output
    assert "put_get_ms=" in output
    assert "FAILED" not in output


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ppo_vs_sb3_benchmark_quick() -> None:
    pytest.importorskip(
        "stable_baselines3", reason="the bench extra installs stable-baselines3; test does not"
    )
    output = run("ppo_vs_sb3.py", "--quick")
    for row in ("0  rlcollect", "0  SB3 (RL Zoo)"):
        assert row in output
    assert "seconds to solve, rlcollect / SB3" in output
    assert "FAILED" not in output


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_scaling_benchmark_quick(tmp_path: Path) -> None:
    output = run(
        "scaling.py",
        *("--quick", "--in-process", "--env", "cartpole", "--envs", "2"),
        *("--impls", "ours-serial", "ours-multi-envpool", "gym-loop"),
        *("--seconds", "0.1", "--chunks", "1"),
        *("--out", str(tmp_path)),
    )
    assert "FAILED" not in output
    rows = (tmp_path / "scaling_cartpole.csv").read_text().splitlines()
    assert rows[0] == "env,implementation,num_envs,frames_per_s"
    assert {row.split(",")[1] for row in rows[1:]} == {
        "ours-serial",
        "ours-multi-envpool",
        "gym-loop",
        "ours-best",
    }
    assert (tmp_path / "scaling_cartpole.png").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_benchmark_quick() -> None:
    output = run("ctrl_c.py", "--quick")
    assert "all_s" in output
    assert "'left': 0" in output, "a process outlived the measurement"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_batched_inference_benchmark_measures_the_pixel_case() -> None:
    """One measurement of benchmarks/batched_inference.py: our server over 2 env workers on the
    4x84x84 uint8 frames with the Nature CNN (the full run adds TorchRL's rows)."""
    output = run(
        "batched_inference.py",
        *("--measure", "ours-thread", "--workers", "2", "--policy", "pixel", "--seconds", "0.5"),
    )
    result = json.loads(output.strip().splitlines()[-1])
    assert result["fps"] > 0
    assert 1 <= result["rows_per_forward"] <= 2


@pytest.mark.timeout(120)
def test_replay_benchmark_quick_run_prints_the_table() -> None:
    output = run("replay.py", "--quick")
    for row in ("tensor+random", "memmap+random", "tensor+prioritized", "ratio"):
        assert row in output


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gpu_benchmark_quick_on_cpu(tmp_path: Path) -> None:
    """benchmarks/gpu.py's dry run: every case's eager rows measured on the CPU, the CUDA-graph
    rows marked n/a, the table printed and written with its JSON."""
    output = run(
        "gpu.py", *("--device", "cpu", "--quick", "--pixel", "frames", "--out", str(tmp_path))
    )
    assert "FAILED" not in output
    assert "| CartPole-v1 x8 | MLP 4-64-64-2 | rlcollect | no |" in output
    report = json.loads((tmp_path / "gpu_benchmark.json").read_text())
    assert report["device"] == "cpu"
    rows = {(r["env"], r["policy"], r["implementation"], r["cudagraph"]): r for r in report["rows"]}
    cases = {
        ("CartPole-v1 x8", "MLP 4-64-64-2"),
        ("CartPole-v1 x8", "MLP 4-1024x3-2"),
        ("StackedFrames x8", "Nature CNN"),
    }
    implementations = {("hand loop", False), ("rlcollect", False), ("rlcollect", True)}
    implementations |= {("torchrl", False), ("torchrl", True)}
    assert set(rows) == {(*case, *row) for case in cases for row in implementations}
    for row in rows.values():
        if row["cudagraph"]:
            assert (row["fps"], row["status"]) == (None, "n/a (no CUDA)")
        else:
            assert row["fps"] > 0, row
            assert row["ratio_hand_loop"] > 0
            assert row["ratio_torchrl"] > 0
    table = (tmp_path / "gpu_benchmark.md").read_text()
    assert (
        "| env | policy | implementation | cudagraph | frames/s | / hand loop | / TorchRL |"
        in table
    )
    assert table.count("n/a (no CUDA)") == 6


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_rllib_benchmark_quick() -> None:
    pytest.importorskip(
        "ray.rllib", reason="RLlib is not importable: install the rllib extra", exc_type=ImportError
    )
    output = run("rllib.py", "--quick", "--envs", "1", "8", "--frames", "200")
    assert "ours/RLlib" in output
    assert "target >= 3x RLlib's runner at 8 envs" in output


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_rllib_benchmark_train_quick(tmp_path: Path) -> None:
    """The learning-parity mode: one tiny PPO iteration with RLlib's runner and with ours."""
    pytest.importorskip(
        "ray.rllib", reason="RLlib is not importable: install the rllib extra", exc_type=ImportError
    )
    written = tmp_path / "train.json"
    output = run("rllib.py", "--train", "--quick", "--json", str(written))
    assert "| seed | runner | reached 0 | return mean |" in output
    rows = json.loads(written.read_text())
    assert [(row["runner"], row["seed"]) for row in rows] == [("rllib", 0), ("rlcollect", 0)]
    for row in rows:
        # One iteration of a 200-step batch (1 env: exactly the batch), ending in an episode.
        assert (row["iterations"], row["env_steps"], row["reached"]) == (1, 200, True)
        assert row["return_mean"] > 0

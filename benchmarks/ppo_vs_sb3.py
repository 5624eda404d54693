"""PPO on CartPole-v1, side by side: `examples/ppo.py` (its default config) vs Stable-Baselines3.

SB3 runs PPO with RL Zoo's tuned CartPole-v1 hyperparameters: 8 envs (`DummyVecEnv`),
`n_steps=32`, `batch_size=256`, `n_epochs=20`, `gamma=0.98`, `gae_lambda=0.8`, `ent_coef=0`,
learning rate 1e-3 and clip range 0.2 both annealed linearly to 0, 100k steps, `MlpPolicy`.
Each run, ours or SB3's, is a fresh interpreter with one torch thread (SB3 measured faster with
one thread than with its default on the 2-core development machine); for each seed ours runs,
then SB3, so that other load on the machine hits both alike.

Each run reports when the mean return of the last 100 finished training episodes (our
`mean_return_last_100`, SB3's `ep_rew_mean`) first reaches 475 ("solved"), in frames and in
wall-clock seconds, and the mean return of 10 greedy episodes at the end of the run. Seconds
count from the start of training, the same way for both: ours from the run's clock
(`wall_time_s` in `metrics.csv`, started once the env, networks and collector are built), SB3's
from the start of `learn()` (once `PPO(...)` built them); both include the first env reset and
every update, and read the mean after each update (SB3: when the next rollout starts). Imports,
construction and the final evaluation are left out of both.

    python benchmarks/ppo_vs_sb3.py              # 3 seeds (about 2 minutes on 2 cores)
    python benchmarks/ppo_vs_sb3.py --seeds 5
    python benchmarks/ppo_vs_sb3.py --quick      # smoke run: 2,048 frames each, nothing solves
    python benchmarks/ppo_vs_sb3.py --override optim.lr=1e-3   # Hydra overrides for ours
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENV_ID = "CartPole-v1"
SOLVED_RETURN = 475.0
EVAL_SEED_OFFSET = 1_000_003  # as examples/common/evaluation.py: states training never sees
QUICK_FRAMES = 2048
RUN_TIMEOUT = 600  # seconds a run may take before it counts as failed

# RL Zoo's hyperparameters for PPO on CartPole-v1 (hyperparams/ppo.yml)
SB3_ENVS = 8
SB3_FRAMES = 100_000
SB3_HYPERPARAMETERS = {
    "n_steps": 32,
    "batch_size": 256,
    "n_epochs": 20,
    "gamma": 0.98,
    "gae_lambda": 0.8,
    "ent_coef": 0.0,
}
SB3_LEARNING_RATE = 1e-3
SB3_CLIP_RANGE = 0.2


@dataclass
class RunResult:
    """What one run reports; `solved_*` are None when the run never solved."""

    solved_frames: int | None
    solved_seconds: float | None
    final_eval: float
    frames: int
    seconds: float


def run_command(command: list[str]) -> str | subprocess.CompletedProcess[str]:
    """Run `command`: its completed process, or why it failed (the tail of its stderr)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"no result within {RUN_TIMEOUT} s"
    if done.returncode != 0:
        return done.stderr.strip()[-300:]
    return done


# --- ours: examples/ppo.py with its default config ----------------------------------------------


def first_solved(rows: list[dict[str, str]]) -> tuple[int | None, float | None]:
    """Frames and seconds of the first metrics row whose 100-episode mean reaches 475."""
    for row in rows:
        if row["mean_return_last_100"] and float(row["mean_return_last_100"]) >= SOLVED_RETURN:
            return int(row["frames"]), float(row["wall_time_s"])
    return None, None


def run_ours(seed: int, overrides: list[str], eval_episodes: int) -> RunResult | str:
    """`python examples/ppo.py seed=<seed>` in a temporary run dir; its result from metrics.csv."""
    with tempfile.TemporaryDirectory() as run_dir:
        command = [
            sys.executable,
            str(ROOT / "examples" / "ppo.py"),
            f"hydra.run.dir={run_dir}",
            f"seed={seed}",
            "progress=false",
            f"eval_episodes={eval_episodes}",
            *overrides,
        ]
        done = run_command(command)
        if isinstance(done, str):
            return done
        with (Path(run_dir) / "metrics.csv").open(newline="") as file:
            rows = list(csv.DictReader(file))
    solved_frames, solved_seconds = first_solved(rows)
    last = rows[-1]
    return RunResult(
        solved_frames,
        solved_seconds,
        float(last.get("final_eval_return") or math.nan),
        int(last["frames"]),
        float(last["wall_time_s"]),
    )


# --- SB3: PPO with RL Zoo's hyperparameters, in a fresh interpreter ------------------------------


def linear(start: float) -> Callable[[float], float]:
    """RL Zoo's `lin_<start>` schedule: SB3 passes the remaining progress, 1 down to 0."""
    return lambda progress_remaining: progress_remaining * start


def solve_clock() -> Any:
    """An SB3 callback noting when the 100-episode mean first reaches 475, checked after each
    update (SB3 is imported here: only the SB3 subprocess needs it)."""
    import numpy as np
    from stable_baselines3.common.callbacks import BaseCallback

    class SolveClock(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.started = 0.0
            self.solved: tuple[int, float] | None = None

        def _on_training_start(self) -> None:
            self.started = time.perf_counter()

        def _on_rollout_start(self) -> None:  # after the previous rollout's update
            self.check()

        def _on_training_end(self) -> None:
            self.check()

        def _on_step(self) -> bool:
            return True

        def check(self) -> None:
            episodes = self.model.ep_info_buffer  # the last 100 finished episodes
            if self.solved is not None or not episodes:
                return
            if float(np.mean([episode["r"] for episode in episodes])) >= SOLVED_RETURN:
                self.solved = (self.model.num_timesteps, time.perf_counter() - self.started)

    return SolveClock()


def train_sb3(seed: int, frames: int, eval_episodes: int) -> dict[str, Any]:
    """Train SB3's PPO (in the SB3 subprocess) and return the fields of its RunResult."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(1)
    env = make_vec_env(ENV_ID, n_envs=SB3_ENVS, seed=seed)
    model = PPO(
        "MlpPolicy",
        env,
        learning_rate=linear(SB3_LEARNING_RATE),
        clip_range=linear(SB3_CLIP_RANGE),
        seed=seed,
        verbose=0,
        **SB3_HYPERPARAMETERS,
    )
    clock = solve_clock()
    started = time.perf_counter()
    model.learn(frames, callback=clock)
    seconds = time.perf_counter() - started
    eval_env = make_vec_env(ENV_ID, n_envs=SB3_ENVS, seed=seed + EVAL_SEED_OFFSET)
    final_eval, _ = evaluate_policy(model, eval_env, n_eval_episodes=eval_episodes)
    solved_frames, solved_seconds = clock.solved or (None, None)
    return {
        "solved_frames": solved_frames,
        "solved_seconds": solved_seconds,
        "final_eval": float(final_eval),
        "frames": int(model.num_timesteps),
        "seconds": seconds,
    }


def run_sb3(seed: int, frames: int, eval_episodes: int) -> RunResult | str:
    """`train_sb3` in a fresh interpreter: its result, or the tail of its error."""
    command = [sys.executable, __file__, "--sb3-run", str(seed), "--sb3-frames", str(frames)]
    command += ["--eval-episodes", str(eval_episodes)]
    done = run_command(command)
    if isinstance(done, str):
        return done
    return RunResult(**json.loads(done.stdout.strip().splitlines()[-1]))


# --- report -------------------------------------------------------------------------------------


def cell(value: float | None, digits: int = 1) -> str:
    return "not solved" if value is None else f"{value:,.{digits}f}"


def print_row(seed: int, name: str, result: RunResult | str) -> None:
    if isinstance(result, str):
        print(f"{seed:>4}  {name:<12} FAILED: {result}")
        return
    print(
        f"{seed:>4}  {name:<12} {cell(result.solved_frames, 0):>15} "
        f"{cell(result.solved_seconds):>12} {result.final_eval:>12.1f} "
        f"{result.frames:>9,} {result.seconds:>9.1f}"
    )


def print_ratios(pairs: list[tuple[RunResult | str, RunResult | str]]) -> None:
    """Our seconds to solve over SB3's, per seed and for the medians."""
    ratios, ours_seconds, sb3_seconds = [], [], []
    for ours, sb3 in pairs:
        if isinstance(ours, str) or isinstance(sb3, str):
            continue
        if ours.solved_seconds is None or sb3.solved_seconds is None:
            continue
        ours_seconds.append(ours.solved_seconds)
        sb3_seconds.append(sb3.solved_seconds)
        ratios.append(ours.solved_seconds / sb3.solved_seconds)
    if not ratios:
        print("\nseconds to solve, rlcollect / SB3: n/a (a run did not solve)")
        return
    per_seed = ", ".join(f"{ratio:.2f}" for ratio in ratios)
    median = statistics.median(ours_seconds) / statistics.median(sb3_seconds)
    print(f"\nseconds to solve, rlcollect / SB3: per seed {per_seed}; medians {median:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (2,048 frames each)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0 .. seeds-1")
    parser.add_argument("--eval-episodes", type=int, default=10, help="final greedy episodes")
    parser.add_argument("--override", nargs="*", default=[], help="Hydra overrides for ours")
    parser.add_argument("--sb3-run", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--sb3-frames", type=int, default=SB3_FRAMES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sb3_run is not None:
        print(json.dumps(train_sb3(args.sb3_run, args.sb3_frames, args.eval_episodes)))
        return
    seeds = 1 if args.quick else args.seeds
    eval_episodes = 1 if args.quick else args.eval_episodes
    ours_overrides = [*args.override]
    sb3_frames = SB3_FRAMES
    if args.quick:
        ours_overrides.append(f"collector.total_frames={QUICK_FRAMES}")
        sb3_frames = QUICK_FRAMES
    print(
        f"PPO on {ENV_ID}: solved when the mean return of the last 100 training episodes "
        f"reaches {SOLVED_RETURN:.0f}; final greedy evaluation over {eval_episodes} episodes"
    )
    print(f"rlcollect: examples/ppo.py, default config {' '.join(ours_overrides)}".rstrip())
    print(f"SB3: RL Zoo hyperparameters, {sb3_frames:,} frames, 1 torch thread")
    print(
        f"{'seed':>4}  {'run':<12} {'frames solved':>15} {'s solved':>12} {'final eval':>12} "
        f"{'frames':>9} {'total s':>9}"
    )
    pairs = []
    for seed in range(seeds):
        ours = run_ours(seed, ours_overrides, eval_episodes)
        print_row(seed, "rlcollect", ours)
        sb3 = run_sb3(seed, sb3_frames, eval_episodes)
        print_row(seed, "SB3 (RL Zoo)", sb3)
        pairs.append((ours, sb3))
    print_ratios(pairs)


if __name__ == "__main__":
    main()

"""SAC on Pendulum-v1, side by side: `examples/sac.py` (its default config) vs Stable-Baselines3.

SB3's SAC gets the hyperparameters of our run, read from `examples/conf/sac.yaml` with the
same overrides: network sizes (ReLU), learning rate, batch size, buffer size, gamma, tau,
gradient steps per frame, random frames before learning (SB3's `learning_starts` does both),
automatic entropy tuning from the same start, and the same frame budget, on one env
(`DummyVecEnv`). So the comparison is of the two implementations on one algorithm, not of two
tunings. Each run is a fresh interpreter with one torch thread; for each seed ours runs, then
SB3, so that other load on the machine hits both alike.

Each run reports when the mean return of the last 10 finished training episodes (our
`mean_return_last_10`, logged after every episode here; SB3's last 10 `ep_info_buffer`
entries, checked as each episode ends) first reaches -200 ("solved"), in frames and in
wall-clock seconds, and the mean return of 10 greedy episodes at the end of the run. Seconds
count from the start of training: ours from the run's clock (`wall_time_s`, started once the
env, networks and collector are built), SB3's from the start of `learn()`. Imports,
construction and the final evaluation are left out of both.

    python benchmarks/sac_vs_sb3.py              # 1 seed, 12,000 frames each
    python benchmarks/sac_vs_sb3.py --seeds 3
    python benchmarks/sac_vs_sb3.py --quick      # smoke run: 1,500 frames each, nothing solves
    python benchmarks/sac_vs_sb3.py --override sac.utd_ratio=2   # Hydra overrides (both)
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENV_ID = "Pendulum-v1"
SOLVED_RETURN = -200.0
SOLVE_WINDOW = 10  # episodes
EVAL_SEED_OFFSET = 1_000_003  # as examples/common/evaluation.py: states training never sees
QUICK_OVERRIDES = (
    "collector.total_frames=1500",
    "collector.init_random_frames=500",
    "sac.learning_starts=500",
)
RUN_TIMEOUT = 1200  # seconds a run may take before it counts as failed


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


def our_config(overrides: list[str]) -> dict[str, Any]:
    """`examples/conf/sac.yaml` with `overrides`, resolved, as a plain dict."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(str(ROOT / "examples" / "conf"), version_base=None):
        cfg = compose("sac", overrides=overrides)
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


# --- ours: examples/sac.py ----------------------------------------------------------------------


def first_solved(rows: list[dict[str, str]]) -> tuple[int | None, float | None]:
    """Frames and seconds of the first metrics row whose 10-episode mean reaches -200."""
    for row in rows:
        if row["mean_return_last_10"] and float(row["mean_return_last_10"]) >= SOLVED_RETURN:
            return int(row["frames"]), float(row["wall_time_s"])
    return None, None


def run_ours(seed: int, overrides: list[str], eval_episodes: int) -> RunResult | str:
    """`python examples/sac.py seed=<seed>` in a temporary run dir; its result from metrics.csv."""
    with tempfile.TemporaryDirectory() as run_dir:
        command = [
            sys.executable,
            str(ROOT / "examples" / "sac.py"),
            f"hydra.run.dir={run_dir}",
            f"seed={seed}",
            "progress=false",
            "log_every=200",  # one row per Pendulum episode: the solve is seen when it happens
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


# --- SB3: SAC with our hyperparameters, in a fresh interpreter ----------------------------------


def solve_clock() -> Any:
    """An SB3 callback noting when the mean of the last 10 episodes first reaches -200,
    checked as each episode ends (SB3 is imported here: only the SB3 subprocess needs it)."""
    import numpy as np
    from stable_baselines3.common.callbacks import BaseCallback

    class SolveClock(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.started = 0.0
            self.solved: tuple[int, float] | None = None
            self.episode_end: tuple[int, float] | None = None

        def _on_training_start(self) -> None:
            self.started = time.perf_counter()

        def _on_step(self) -> bool:
            # SB3 adds a finished episode to ep_info_buffer after this call: the episode that
            # ended at the previous step is checked now, timed when it ended.
            self.check()
            if bool(self.locals["dones"].any()):
                self.episode_end = (self.model.num_timesteps, time.perf_counter() - self.started)
            return True

        def _on_training_end(self) -> None:
            self.check()

        def check(self) -> None:
            if self.solved is not None or self.episode_end is None:
                return
            episodes = list(self.model.ep_info_buffer)[-SOLVE_WINDOW:]
            if float(np.mean([episode["r"] for episode in episodes])) >= SOLVED_RETURN:
                self.solved = self.episode_end
            self.episode_end = None

    return SolveClock()


def sb3_hyperparameters(cfg: dict[str, Any]) -> dict[str, Any]:
    """SB3 `SAC(...)` arguments equal to our config's."""
    import torch

    sac = cfg["sac"]
    if cfg["actor"]["hidden_sizes"] != cfg["critic"]["hidden_sizes"]:
        print("note: SB3 gets the actor's sizes for both networks", file=sys.stderr)
    return {
        "learning_rate": cfg["optim"]["lr"],
        "buffer_size": cfg["replay_buffer"]["storage"]["max_size"],
        # SB3 acts at random until it starts learning
        "learning_starts": max(sac["learning_starts"], cfg["collector"]["init_random_frames"]),
        "batch_size": cfg["replay_buffer"]["batch_size"],
        "tau": sac["tau"],
        "gamma": sac["gamma"],
        "train_freq": 1,
        "gradient_steps": max(1, round(sac["utd_ratio"])),
        "ent_coef": f"auto_{sac['init_alpha']}",
        "target_entropy": "auto" if sac["target_entropy"] is None else sac["target_entropy"],
        "policy_kwargs": {
            "net_arch": list(cfg["actor"]["hidden_sizes"]),
            "activation_fn": torch.nn.ReLU,
        },
    }


def train_sb3(seed: int, overrides: list[str], eval_episodes: int) -> dict[str, Any]:
    """Train SB3's SAC (in the SB3 subprocess) and return the fields of its RunResult."""
    import torch
    from stable_baselines3 import SAC
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(1)
    cfg = our_config(overrides)
    env = make_vec_env(ENV_ID, n_envs=1, seed=seed)
    model = SAC("MlpPolicy", env, seed=seed, verbose=0, **sb3_hyperparameters(cfg))
    clock = solve_clock()
    started = time.perf_counter()
    model.learn(cfg["collector"]["total_frames"], callback=clock)
    seconds = time.perf_counter() - started
    final_eval = math.nan
    if eval_episodes > 0:
        eval_env = make_vec_env(ENV_ID, n_envs=1, seed=seed + EVAL_SEED_OFFSET)
        final_eval, _ = evaluate_policy(model, eval_env, n_eval_episodes=eval_episodes)
    solved_frames, solved_seconds = clock.solved or (None, None)
    return {
        "solved_frames": solved_frames,
        "solved_seconds": solved_seconds,
        "final_eval": float(final_eval),
        "frames": int(model.num_timesteps),
        "seconds": seconds,
    }


def run_sb3(seed: int, overrides: list[str], eval_episodes: int) -> RunResult | str:
    """`train_sb3` in a fresh interpreter: its result, or the tail of its error."""
    command = [sys.executable, __file__, "--sb3-run", str(seed)]
    command += ["--eval-episodes", str(eval_episodes), "--override", *overrides]
    done = run_command(command)
    if isinstance(done, str):
        return done
    return RunResult(**json.loads(done.stdout.strip().splitlines()[-1]))


# --- report -------------------------------------------------------------------------------------


def cell(value: float | None, digits: int = 1) -> str:
    return "not solved" if value is None else f"{value:,.{digits}f}"


def print_row(seed: int, name: str, result: RunResult | str) -> None:
    if isinstance(result, str):
        print(f"{seed:>4}  {name:<10} FAILED: {result}")
        return
    print(
        f"{seed:>4}  {name:<10} {cell(result.solved_frames, 0):>15} "
        f"{cell(result.solved_seconds):>12} {result.final_eval:>12.1f} "
        f"{result.frames:>9,} {result.seconds:>9.1f}"
    )


def print_ratios(pairs: list[tuple[RunResult | str, RunResult | str]]) -> None:
    """Our seconds over SB3's, to solve and in total, per seed and for the medians."""
    done = [(o, s) for o, s in pairs if isinstance(o, RunResult) and isinstance(s, RunResult)]
    if not done:
        return
    ours_total = statistics.median(ours.seconds for ours, _ in done)
    sb3_total = statistics.median(sb3.seconds for _, sb3 in done)
    print(f"\ntotal seconds, rlcollect / SB3 (medians): {ours_total / sb3_total:.2f}x")
    solved = [
        (ours.solved_seconds, sb3.solved_seconds)
        for ours, sb3 in done
        if ours.solved_seconds is not None and sb3.solved_seconds is not None
    ]
    if not solved:
        print("seconds to solve, rlcollect / SB3: n/a (a run did not solve)")
        return
    per_seed = ", ".join(f"{ours / sb3:.2f}" for ours, sb3 in solved)
    median = statistics.median(o for o, _ in solved) / statistics.median(s for _, s in solved)
    print(f"seconds to solve, rlcollect / SB3: per seed {per_seed}; medians {median:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (1,500 frames each)")
    parser.add_argument("--seeds", type=int, default=1, help="seeds 0 .. seeds-1")
    parser.add_argument("--eval-episodes", type=int, default=10, help="final greedy episodes")
    parser.add_argument("--override", nargs="*", default=[], help="Hydra overrides (both runs)")
    parser.add_argument("--sb3-run", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sb3_run is not None:
        print(json.dumps(train_sb3(args.sb3_run, args.override, args.eval_episodes)))
        return
    seeds = 1 if args.quick else args.seeds
    eval_episodes = 1 if args.quick else args.eval_episodes
    overrides = [*(QUICK_OVERRIDES if args.quick else ()), *args.override]
    frames = our_config(overrides)["collector"]["total_frames"]
    print(
        f"SAC on {ENV_ID}: solved when the mean return of the last {SOLVE_WINDOW} training "
        f"episodes reaches {SOLVED_RETURN:.0f}; final greedy evaluation over {eval_episodes} "
        f"episodes; {frames:,} frames each, 1 torch thread"
    )
    print(f"both: examples/conf/sac.yaml {' '.join(overrides)}".rstrip())
    print(
        f"{'seed':>4}  {'run':<10} {'frames solved':>15} {'s solved':>12} {'final eval':>12} "
        f"{'frames':>9} {'total s':>9}"
    )
    pairs = []
    for seed in range(seeds):
        ours = run_ours(seed, overrides, eval_episodes)
        print_row(seed, "rlcollect", ours)
        sb3 = run_sb3(seed, overrides, eval_episodes)
        print_row(seed, "SB3", sb3)
        pairs.append((ours, sb3))
    print_ratios(pairs)


if __name__ == "__main__":
    main()

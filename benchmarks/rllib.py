"""RLlib's sampling, through RLlib's own `SingleAgentEnvRunner` and through ours
(`rlcollect.rllib.SingleAgentEnvRunner`), side by side in one run.

Both runners are built from the same config (PPO's default RLModule, an MLP 256-256 with a
categorical head, on CartPole-v1, `num_envs_per_env_runner` = 1, 8, 64) in this process, as an
Algorithm builds a remote runner, and time `sample(num_timesteps=F)` in turn (RLlib's, ours,
RLlib's, ...), so both run under the same load. One torch thread, as in RLlib's runner actors.
Reported: the median frames/s of each over the rounds, by wall clock and by process CPU time
(what other jobs on a shared machine disturb least), and ours / RLlib's. Where EnvPool is
installed, ours also runs on `EnvPoolBackend()` (the same task, EnvPool's CartPole, in the same
turns): the speed an RLlib user gets by picking that backend in one line.

With `--train`, learning parity instead: RLlib's PPO on CartPole-v1 (RLlib's tuned CartPole
example: lr 3e-4, 6 epochs, vf_loss_coeff 0.01, a 32-unit linear MLP with a shared value
layer, 4,000 steps per batch) trained until the episode return mean reaches 450, for each seed
with RLlib's runner and with ours in turn (seed 0 RLlib, seed 0 ours, seed 1 RLlib, ...), so both
run under the same load. Reported per run: the env steps sampled to reach 450
(`num_env_steps_sampled_lifetime`), the iterations, the training wall time and the part of it
spent in the runner's `sample()` (timed with `--env-runners 0`, the default, where the
Algorithm's local runner samples); then the medians. Writes the rows with `--json`.

Needs the `rllib` extra (ray[rllib]).

    python benchmarks/rllib.py            # 1 / 8 / 64 envs, 5 rounds of 4,000 frames
    python benchmarks/rllib.py --quick    # smoke run: 2 rounds of 500 frames
    python benchmarks/rllib.py --train    # seeds 0 1 2, up to 75 iterations / 1,200 s a run
    python benchmarks/rllib.py --train --quick   # smoke run: 1 seed, 1 tiny iteration each
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

ENV_ID = "CartPole-v1"
NUM_ENVS = (1, 8, 64)
# The target: ours at least this many times RLlib's runner at 8 envs.
TARGET_AT_8 = 3.0
# Learning parity: the return RLlib's tuned CartPole example stops at, and its step budget
# (300,000 env steps: 75 batches of 4,000).
TRAIN_THRESHOLD = 450.0
TRAIN_SEEDS = (0, 1, 2)
TRAIN_MAX_ITERATIONS = 75
TRAIN_MAX_SECONDS = 1200.0
RUNNERS = ("rllib", "rlcollect")


def build_runners(num_envs: int) -> dict[str, object]:
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner as RLlibRunner

    from rlcollect.rllib import SingleAgentEnvRunner

    config = PPOConfig().environment(ENV_ID).env_runners(num_envs_per_env_runner=num_envs)
    runners = {
        "rllib": RLlibRunner(config=config, worker_index=1),
        "rlcollect": SingleAgentEnvRunner(config=config, worker_index=1),
    }
    if has_envpool():
        from rlcollect.rllib import EnvPoolBackend

        envpool_runner = SingleAgentEnvRunner.with_backend(EnvPoolBackend(num_threads=1))
        runners["rlcollect_envpool"] = envpool_runner(config=config, worker_index=1)
    state = runners["rllib"].get_state()
    for name in runners:
        if name != "rllib":
            runners[name].set_state(state)  # the same weights in all
    return runners


def has_envpool() -> bool:
    try:
        import envpool  # noqa: F401
    except ImportError:
        return False
    return True


def time_sample(runner: object, frames: int) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, frames) of one `sample(num_timesteps=frames)`."""
    wall, cpu = time.perf_counter(), time.process_time()
    episodes = runner.sample(num_timesteps=frames)
    done = sum(len(episode) for episode in episodes)
    return time.perf_counter() - wall, time.process_time() - cpu, done


def measure(num_envs: int, frames: int, rounds: int) -> dict[str, object]:
    runners = build_runners(num_envs)
    for runner in runners.values():
        runner.sample(num_timesteps=min(frames, 200 * num_envs))  # warm-up
    rates: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in runners}
    for _ in range(rounds):
        for name, runner in runners.items():
            wall, cpu, done = time_sample(runner, frames)
            rates[name]["wall"].append(done / wall)
            rates[name]["cpu"].append(done / max(cpu, 1e-9))
    for runner in runners.values():
        runner.stop()
    row: dict[str, object] = {"num_envs": num_envs}
    for name in runners:
        for clock in ("wall", "cpu"):
            row[f"{name}_{clock}_fps"] = statistics.median(rates[name][clock])
    for clock in ("wall", "cpu"):
        row[f"ratio_{clock}"] = row[f"rlcollect_{clock}_fps"] / row[f"rllib_{clock}_fps"]
        if "rlcollect_envpool" in runners:
            envpool_fps = row[f"rlcollect_envpool_{clock}_fps"]
            row[f"ratio_envpool_{clock}"] = envpool_fps / row[f"rllib_{clock}_fps"]
    return row


def train_config(runner: str, seed: int, num_env_runners: int, quick: bool) -> object:
    """RLlib's tuned CartPole PPO config, sampled by `runner` ("rllib" or "rlcollect"); with
    `quick`, a tiny batch (the smoke run only checks that the path runs)."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    from rlcollect.rllib import SingleAgentEnvRunner

    config = (
        PPOConfig()
        .environment(ENV_ID)
        .env_runners(num_env_runners=num_env_runners)
        .training(lr=3e-4, num_epochs=6, vf_loss_coeff=0.01)
        .rl_module(
            model_config=DefaultModelConfig(
                fcnet_hiddens=[32], fcnet_activation="linear", vf_share_layers=True
            )
        )
        .debugging(seed=seed)
    )
    if runner == "rlcollect":
        config.env_runners(env_runner_cls=SingleAgentEnvRunner)
    if quick:
        config.training(train_batch_size_per_learner=200, minibatch_size=50, num_epochs=1)
    return config


def time_local_sampling(algo: object) -> list[float]:
    """Wrap the Algorithm's local runner's `sample()` (the one that samples with
    num_env_runners=0) to add up its wall time in the returned one-item list."""
    runner = algo.env_runner
    original = runner.sample
    spent = [0.0]

    def timed(*args: object, **kwargs: object) -> object:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - started

    runner.sample = timed
    return spent


def train_to_threshold(runner: str, seed: int, args: argparse.Namespace) -> dict[str, object]:
    """Train until the episode return mean reaches the threshold, or the iteration or time
    cap is hit; the env steps sampled then, the iterations and the wall times."""
    from ray.rllib.utils.metrics import (
        ENV_RUNNER_RESULTS,
        EPISODE_RETURN_MEAN,
        NUM_ENV_STEPS_SAMPLED_LIFETIME,
    )

    started = time.perf_counter()
    algo = train_config(runner, seed, args.env_runners, args.quick).build_algo()
    built = time.perf_counter()
    sampling = time_local_sampling(algo)
    iterations, returns, steps = 0, float("nan"), 0
    try:
        while iterations < args.max_iterations and time.perf_counter() - built < args.max_seconds:
            result = algo.train()
            iterations += 1
            returns = result[ENV_RUNNER_RESULTS].get(EPISODE_RETURN_MEAN, float("nan"))
            steps = int(result[ENV_RUNNER_RESULTS][NUM_ENV_STEPS_SAMPLED_LIFETIME])
            if returns >= args.threshold:
                break
    finally:
        algo.stop()
    return {
        "runner": runner,
        "seed": seed,
        "reached": bool(returns >= args.threshold),
        "return_mean": returns,
        "iterations": iterations,
        "env_steps": steps,
        "train_s": time.perf_counter() - built,
        "build_s": built - started,
        # Where the time went: the runner's sample() calls, and the rest (the Learner's update,
        # weight sync, metrics); only the local runner's sampling is timed (num_env_runners=0).
        "sample_s": sampling[0] if args.env_runners == 0 else float("nan"),
    }


def print_train_table(rows: list[dict[str, object]], threshold: float) -> None:
    """Each run, then each runner's medians (over the runs that reached the threshold)."""
    print(
        f"| seed | runner | reached {threshold:g} | return mean | iterations | env steps | "
        "train wall s | of it sampling s | build s |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['seed']} | {row['runner']} | {'yes' if row['reached'] else 'NO'} | "
            f"{row['return_mean']:.1f} | {row['iterations']} | {row['env_steps']:,} | "
            f"{row['train_s']:.1f} | {row['sample_s']:.1f} | {row['build_s']:.1f} |",
            flush=True,
        )
    print(
        "\n| runner | runs reached | median env steps | median train wall s | median sampling s |"
    )
    print("|---|---:|---:|---:|---:|")
    medians = {runner: train_medians(rows, runner) for runner in RUNNERS}
    for runner, median in medians.items():
        runs = sum(row["runner"] == runner for row in rows)
        print(
            f"| {runner} | {median['reached']}/{runs} | {median['env_steps']:,.0f} | "
            f"{median['train_s']:.1f} | {median['sample_s']:.1f} |"
        )
    ratio = medians["rllib"]["train_s"] / medians["rlcollect"]["train_s"]
    print(f"median train wall time, RLlib's / ours: {ratio:.2f}x")


def train_medians(rows: list[dict[str, object]], runner: str) -> dict[str, float]:
    """The medians of `runner`'s runs that reached the threshold (NaN where none did)."""
    reached = [row for row in rows if row["runner"] == runner and row["reached"]]
    medians: dict[str, float] = {"reached": len(reached)}
    for key in ("env_steps", "train_s", "sample_s"):
        medians[key] = statistics.median(row[key] for row in reached) if reached else float("nan")
    return medians


def run_training(args: argparse.Namespace) -> None:
    """Learning parity: every seed with RLlib's runner, then ours, in turn."""
    if args.quick:
        args.seeds, args.max_iterations, args.threshold = args.seeds[:1], 1, 0.0
    print(
        f"PPO on {ENV_ID} to an episode return mean of {args.threshold:g}, seeds {args.seeds}, "
        f"num_env_runners={args.env_runners}, at most {args.max_iterations} iterations / "
        f"{args.max_seconds:.0f} s a run, 1 torch thread",
        flush=True,
    )
    rows = []
    for seed in args.seeds:
        for runner in RUNNERS:
            rows.append(train_to_threshold(runner, seed, args))
            print(json.dumps(rows[-1]), flush=True)  # progress, in case a later run hangs
    print_train_table(rows, args.threshold)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (tiny budget)")
    parser.add_argument("--envs", type=int, nargs="+", default=list(NUM_ENVS))
    parser.add_argument("--frames", type=int, help="frames per timed sample() call")
    parser.add_argument("--rounds", type=int, help="timed calls per runner")
    parser.add_argument("--json", help="also write the rows to this file")
    train = parser.add_argument_group("learning parity (--train)")
    train.add_argument("--train", action="store_true", help="PPO to 450 with both runners")
    train.add_argument("--seeds", type=int, nargs="+", default=list(TRAIN_SEEDS))
    train.add_argument("--threshold", type=float, default=TRAIN_THRESHOLD)
    train.add_argument("--max-iterations", type=int, default=TRAIN_MAX_ITERATIONS)
    train.add_argument("--max-seconds", type=float, default=TRAIN_MAX_SECONDS)
    train.add_argument("--env-runners", type=int, default=0, help="num_env_runners (both)")
    args = parser.parse_args()
    if args.train:
        torch.set_num_threads(1)
        run_training(args)
        return
    frames = args.frames or (500 if args.quick else 4000)
    rounds = args.rounds or (2 if args.quick else 5)
    torch.set_num_threads(1)
    header = (
        f"{'envs':>5} {'RLlib fps':>10} {'ours fps':>10} {'ours/RLlib':>10} "
        f"{'RLlib cpu-fps':>13} {'ours cpu-fps':>12} {'ratio (cpu)':>11}"
    )
    print(f"{ENV_ID}, PPO's default module, {frames} frames x {rounds} rounds, 1 torch thread")
    print(header)
    rows = []
    for num_envs in args.envs:
        row = measure(num_envs, max(frames, num_envs), rounds)
        rows.append(row)
        envpool = (
            f"   ours on EnvPool {row['rlcollect_envpool_wall_fps']:,.0f} fps "
            f"({row['ratio_envpool_wall']:.2f}x; cpu {row['ratio_envpool_cpu']:.2f}x)"
            if "ratio_envpool_wall" in row
            else ""
        )
        print(
            f"{num_envs:>5} {row['rllib_wall_fps']:>10,.0f} {row['rlcollect_wall_fps']:>10,.0f} "
            f"{row['ratio_wall']:>9.2f}x {row['rllib_cpu_fps']:>13,.0f} "
            f"{row['rlcollect_cpu_fps']:>12,.0f} {row['ratio_cpu']:>10.2f}x{envpool}",
            flush=True,
        )
    at_8 = [row for row in rows if row["num_envs"] == 8]
    if at_8:
        verdict = "met" if at_8[0]["ratio_wall"] >= TARGET_AT_8 else "NOT met"
        print(f"target >= {TARGET_AT_8:.0f}x RLlib's runner at 8 envs: {verdict}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=2)


if __name__ == "__main__":
    main()

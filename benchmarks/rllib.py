"""RLlib's sampling, through RLlib's own `SingleAgentEnvRunner` and through ours
(`rlcollect.rllib.SingleAgentEnvRunner`), side by side in one run.

Both runners are built from the same config (PPO's default RLModule, an MLP 256-256 with a
categorical head, on CartPole-v1, `num_envs_per_env_runner` = 1, 8, 64) in this process, as an
Algorithm builds a remote runner, and time `sample(num_timesteps=F)` in turn (RLlib's, ours,
RLlib's, ...), so both run under the same load. One torch thread, as in RLlib's runner actors.
Reported: the median frames/s of each over the rounds, by wall clock and by process CPU time
(what other jobs on a shared machine disturb least), and ours / RLlib's.

Needs the `rllib` extra (ray[rllib]).

    python benchmarks/rllib.py            # 1 / 8 / 64 envs, 5 rounds of 4,000 frames
    python benchmarks/rllib.py --quick    # smoke run: 2 rounds of 500 frames
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


def build_runners(num_envs: int) -> dict[str, object]:
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner as RLlibRunner

    from rlcollect.rllib import SingleAgentEnvRunner

    config = PPOConfig().environment(ENV_ID).env_runners(num_envs_per_env_runner=num_envs)
    runners = {
        "rllib": RLlibRunner(config=config, worker_index=1),
        "rlcollect": SingleAgentEnvRunner(config=config, worker_index=1),
    }
    state = runners["rllib"].get_state()
    runners["rlcollect"].set_state(state)  # the same weights in both
    return runners


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
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (tiny budget)")
    parser.add_argument("--envs", type=int, nargs="+", default=list(NUM_ENVS))
    parser.add_argument("--frames", type=int, help="frames per timed sample() call")
    parser.add_argument("--rounds", type=int, help="timed calls per runner")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
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
        print(
            f"{num_envs:>5} {row['rllib_wall_fps']:>10,.0f} {row['rlcollect_wall_fps']:>10,.0f} "
            f"{row['ratio_wall']:>9.2f}x {row['rllib_cpu_fps']:>13,.0f} "
            f"{row['rlcollect_cpu_fps']:>12,.0f} {row['ratio_cpu']:>10.2f}x",
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

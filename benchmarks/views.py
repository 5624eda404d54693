"""Trajectory views at inference: what they cost a collector, CartPole single env.

Three collectors with the benchmark MLP (`benchmarks/collectors.py`):

* `none`: no views;
* `views`: prev action + prev reward + last 4 observations written at every step and stored in
  the batch; the policy reads its observation only (the collector's own cost, which the issue
  bounds at 15% of frames/s);
* `views-read`: the same views, read by an MLP over all of them (19 inputs instead of 4): what
  a policy using them pays in total, its wider input included.

Each round is a fresh interpreter that builds the three and times their batches in turn
(none, views, views-read, none, ...), by the process's CPU time as well as by the wall clock:
on a shared machine the CPU time is what other jobs disturb least. A round reports the median
batch of each; the ratios are taken within a round, whose collectors ran under the same load.

    python benchmarks/views.py            # full run (5 rounds of 10 batches of 1,000 frames)
    python benchmarks/views.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collectors import FRAMES_PER_BATCH, SamplingPolicy

ENV_ID = "CartPole-v1"
# The collector's cost of the views, as a share of frames/s, that the issue allows.
TARGET_COST = 0.15
VARIANTS = ("none", "views", "views-read")


def view_requirements() -> dict[str, object]:
    from rlcollect import ViewRequirement

    return {
        "prev_action": ViewRequirement("action", shift=-1),
        "prev_reward": ViewRequirement("reward", shift=-1),
        "last_observations": ViewRequirement("observation", shift="-3:0"),
    }


class ViewPolicy(nn.Module):
    """The benchmark MLP over the last 4 observations, the previous action and reward."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.sampler = SamplingPolicy(observation_size=4 * 4 + 2 + 1)

    def forward(
        self, last_observations: torch.Tensor, prev_action: torch.Tensor, prev_reward: torch.Tensor
    ) -> torch.Tensor:
        features = torch.cat(
            [last_observations.flatten(-2), prev_action.to(prev_reward.dtype), prev_reward], -1
        )
        return self.sampler(features)


def policy_module(variant: str) -> nn.Module:
    from tensordict.nn import TensorDictModule

    torch.manual_seed(0)
    if variant == "views-read":
        keys = ["last_observations", "prev_action", "prev_reward"]
        return TensorDictModule(ViewPolicy(), in_keys=keys, out_keys=["action"])
    return TensorDictModule(SamplingPolicy(), in_keys=["observation"], out_keys=["action"])


def build(variant: str) -> object:
    from rlcollect import Collector
    from rlcollect.envs import GymEnv

    return Collector(
        GymEnv(ENV_ID),
        policy_module(variant),
        frames_per_batch=FRAMES_PER_BATCH,
        total_frames=-1,
        view_requirements=None if variant == "none" else view_requirements(),
    )


def run_round(batches: int) -> dict[str, dict[str, float]]:
    """Frames/s of every variant (median batch, CPU and wall time), batches interleaved."""
    torch.set_num_threads(1)
    collectors = {variant: build(variant) for variant in VARIANTS}
    iterators = {variant: iter(collector) for variant, collector in collectors.items()}
    for iterator in iterators.values():
        next(iterator)  # warm-up batch, not timed
    times: dict[str, dict[str, list[float]]] = {v: {"cpu": [], "wall": []} for v in VARIANTS}
    for _ in range(batches):
        for variant, iterator in iterators.items():
            cpu, wall = time.process_time(), time.perf_counter()
            next(iterator)
            times[variant]["cpu"].append(time.process_time() - cpu)
            times[variant]["wall"].append(time.perf_counter() - wall)
    for collector in collectors.values():
        collector.shutdown()
    return {
        variant: {
            clock: FRAMES_PER_BATCH / statistics.median(values) for clock, values in by.items()
        }
        for variant, by in times.items()
    }


def measure(batches: int, rounds: int) -> list[dict[str, dict[str, float]]]:
    """One result per round, each from a fresh interpreter."""
    results = []
    for _ in range(rounds):
        command = [sys.executable, __file__, "--round", "--batches", str(batches)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            print(f"round FAILED: {done.stderr.strip()[-300:]}")
            continue
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--round", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batches", type=int, default=None, help="timed batches per round")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    batches = args.batches or (2 if args.quick else 10)
    rounds = args.rounds or (1 if args.quick else 5)
    if args.round:
        print(json.dumps(run_round(batches)))
        return
    print(
        f"CartPole single env, {rounds} rounds of {batches} interleaved batches of "
        f"{FRAMES_PER_BATCH} frames, 1 thread; frames/s of the median batch (CPU | wall)"
    )
    results = measure(batches, rounds)
    for index, result in enumerate(results):
        cells = "   ".join(
            f"{variant} {result[variant]['cpu']:6.0f} | {result[variant]['wall']:6.0f}"
            for variant in VARIANTS
        )
        print(f"round {index}: {cells}")
    if results:
        print(
            f"\ncost against no views, median of the rounds (`views` target: <= {TARGET_COST:.0%}):"
        )
        for variant in VARIANTS[1:]:
            print_cost(variant, results)


def print_cost(variant: str, results: list[dict[str, dict[str, float]]]) -> None:
    """1 - frames/s of `variant` / frames/s without views, per round; the median of those."""
    costs = {
        clock: statistics.median(1 - r[variant][clock] / r["none"][clock] for r in results)
        for clock in ("cpu", "wall")
    }
    if variant == "views":
        note = "ok" if costs["cpu"] <= TARGET_COST else "ABOVE TARGET"
    else:
        note = "(the policy reads 19 inputs instead of 4)"
    print(f"  {variant:12} CPU {costs['cpu']:6.1%}   wall {costs['wall']:6.1%}   {note}")


if __name__ == "__main__":
    main()

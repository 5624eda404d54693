"""Multi-agent collection throughput, side by side: rlcollect vs TorchRL vs a plain PettingZoo loop.

mpe2's `simple_spread_v3` (3 agents, discrete actions, 25-step episodes), one MLP shared by the
agents (18-64-64-5, sampling its action) called once per step on the group's observations.
Frames are env steps. Every (implementation, round) runs in its own subprocess. The plain loop
and TorchRL step the env PettingZoo builds; `PettingZooEnv` steps it beneath PettingZoo's two
checking wrappers and makes their checks itself (see `unchecked_parallel_env`).

    python benchmarks/multi_agent.py            # 3 interleaved rounds of 5,000 frames
    python benchmarks/multi_agent.py --quick    # smoke run (1 round, 500 frames)
    python benchmarks/multi_agent.py --quick --in-process  # the tests' smoke run, one process
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collectors import add_in_process_option, run_here

FRAMES_PER_BATCH = 500
AGENTS = ["agent_0", "agent_1", "agent_2"]
TARGETS = [("torchrl", 4.0), ("plain", 0.9)]


class SharedPolicy(nn.Module):
    """MLP 18-64-64-5 shared by the agents: samples one categorical action per agent."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(
            nn.Linear(18, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 5)
        )

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        probabilities = self.net(observation).softmax(-1)
        flat = torch.multinomial(probabilities.reshape(-1, 5), 1)
        return flat.reshape(probabilities.shape[:-1])


def make_pettingzoo() -> object:
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=3, continuous_actions=False)


def plain(frames: int) -> float:
    """PettingZoo's own loop: stack the observations, one policy call, step with a dict."""
    env = make_pettingzoo()
    policy = SharedPolicy()
    observations, _ = env.reset(seed=0)
    done_steps = 0

    def run(steps: int) -> None:
        nonlocal observations
        for _ in range(steps):
            with torch.no_grad():
                batch = torch.as_tensor(
                    [observations[agent] for agent in AGENTS], dtype=torch.float32
                )
                actions = policy(batch).tolist()
            observations, _, terminations, truncations, _ = env.step(
                dict(zip(AGENTS, actions, strict=True))
            )
            if any(terminations.values()) or any(truncations.values()):
                observations, _ = env.reset()

    run(FRAMES_PER_BATCH)  # warm-up, as the collectors' first batch
    start = time.perf_counter()
    run(frames)
    done_steps = frames
    return done_steps / (time.perf_counter() - start)


def _module() -> object:
    from tensordict.nn import TensorDictModule

    return TensorDictModule(
        SharedPolicy(), in_keys=[("agent", "observation")], out_keys=[("agent", "action")]
    )


def _time(collector: object, frames: int) -> float:
    iterator = iter(collector)  # type: ignore[call-overload]
    next(iterator)  # warm-up batch, not timed
    start = time.perf_counter()
    collected = 0
    while collected < frames:
        next(iterator)
        collected += FRAMES_PER_BATCH
    return collected / (time.perf_counter() - start)


def torchrl(frames: int) -> float:
    from torchrl.collectors import Collector
    from torchrl.envs import PettingZooWrapper

    env = PettingZooWrapper(make_pettingzoo(), seed=0)
    collector = Collector(env, _module(), frames_per_batch=FRAMES_PER_BATCH, total_frames=-1)
    try:
        return _time(collector, frames)
    finally:
        collector.shutdown()


def ours(frames: int) -> float:
    from rlcollect import Collector
    from rlcollect.envs.pettingzoo_env import PettingZooEnv

    env = PettingZooEnv(make_pettingzoo(), seed=0)
    collector = Collector(env, _module(), frames_per_batch=FRAMES_PER_BATCH, total_frames=-1)
    try:
        return _time(collector, frames)
    finally:
        collector.shutdown()


IMPLEMENTATIONS = {"plain": plain, "torchrl": torchrl, "rlcollect": ours}


def run_subprocess(implementation: str, frames: int) -> float | str:
    command = [sys.executable, __file__, "--impl", implementation, "--frames", str(frames)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return done.stderr.strip()[-300:]
    return float(json.loads(done.stdout.strip().splitlines()[-1])["fps"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--impl", help=argparse.SUPPRESS)
    parser.add_argument("--frames", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    add_in_process_option(parser)
    args = parser.parse_args()
    frames = args.frames or (500 if args.quick else 5_000)
    if args.impl:
        warnings.simplefilter("ignore")
        torch.set_num_threads(1)
        print(json.dumps({"fps": IMPLEMENTATIONS[args.impl](frames)}))
        return
    rounds = args.rounds or (1 if args.quick else 3)
    print(f"simple_spread_v3 (3 agents), {frames} env steps, best of {rounds} rounds, 1 thread")
    if args.in_process:
        warnings.simplefilter("ignore")
        torch.set_num_threads(1)
    best = dict.fromkeys(IMPLEMENTATIONS, 0.0)
    for _ in range(rounds):
        for implementation in IMPLEMENTATIONS:
            if args.in_process:
                result = run_here(IMPLEMENTATIONS[implementation], frames)
            else:
                result = run_subprocess(implementation, frames)
            if isinstance(result, str):
                print(f"{implementation:10} FAILED: {result}")
                continue
            best[implementation] = max(best[implementation], result)
    for implementation, fps in best.items():
        print(f"{implementation:10} {fps:10.0f} env steps/s")
    print("\nratios (target):")
    for other, target in TARGETS:
        if best[other] and best["rlcollect"]:
            ratio = best["rlcollect"] / best[other]
            verdict = "ok" if ratio >= target else "BELOW TARGET"
            print(f"  rlcollect / {other:8} {ratio:6.2f}x  (>= {target}x) {verdict}")


if __name__ == "__main__":
    main()

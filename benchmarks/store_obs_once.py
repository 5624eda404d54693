"""store_obs_once=True against the standard batch: frames/s, and the bytes of an 84x84x3 batch.

Both settings run in this process, interleaved round by round (the order flips every round),
so that a shared machine's drift falls on both; the ratio is taken per round, then the median.
Speeds are frames per second of this process's CPU time (one torch thread; SerialEnv steps in
this process): other processes on a shared machine slow the wall clock, not this count. Wall
clock frames/s are printed too.

    python benchmarks/store_obs_once.py            # 5 rounds of 20,000 frames per case
    python benchmarks/store_obs_once.py --quick    # smoke run (1 round, 2,000 frames)
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from rlcollect import Collector, GymEnv, SerialEnv

FRAMES_PER_BATCH = 1000
PIXELS = (84, 84, 3)


class PixelEnv(gym.Env):
    """84x84x3 uint8 frames (a counter painted into the image), episodes of 30 steps."""

    metadata: dict[str, Any] = {}

    def __init__(self, episode_length: int = 30) -> None:
        self.observation_space = gym.spaces.Box(0, 255, PIXELS, np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.episode_length = episode_length
        self.count = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.count = 0
        return np.zeros(PIXELS, dtype=np.uint8), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.count += 1
        frame = np.full(PIXELS, self.count % 256, dtype=np.uint8)
        return frame, 1.0, self.count >= self.episode_length, False, {}


class SamplingPolicy(nn.Module):
    """MLP 4-64-64-2 sampling a one-hot action (the policy of benchmarks/collectors.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.head = nn.Linear(64, 2)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        probabilities = self.head(self.net(observation)).softmax(-1)
        index = torch.multinomial(probabilities.reshape(-1, 2), 1).reshape(probabilities.shape[:-1])
        return nn.functional.one_hot(index, 2)


def cartpole() -> GymEnv:
    return GymEnv("CartPole-v1")


def pixels() -> GymEnv:
    return GymEnv(PixelEnv())


def cartpole_policy() -> TensorDictModule:
    torch.manual_seed(0)
    return TensorDictModule(SamplingPolicy(), in_keys=["observation"], out_keys=["action"])


# (make env, make policy): the policy is None (random actions) for the pixel env.
CASES: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
    "CartPole single": (cartpole, cartpole_policy),
    "CartPole SerialEnv(8)": (lambda: SerialEnv(8, cartpole), cartpole_policy),
    "84x84x3 uint8 single": (pixels, lambda: None),
}


def frames_per_second(case: str, store_obs_once: bool, frames: int) -> tuple[float, float]:
    """Frames per CPU second and per wall-clock second of one run."""
    make_env, make_policy = CASES[case]
    collector = Collector(
        make_env(), make_policy(), frames_per_batch=FRAMES_PER_BATCH, store_obs_once=store_obs_once
    )
    batches = -(-frames // FRAMES_PER_BATCH)
    try:
        iterator = iter(collector)
        next(iterator)  # warm-up batch, not timed
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(batches):
            next(iterator)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        collected = collector.frames_per_batch * batches
        return collected / cpu, collected / wall
    finally:
        collector.shutdown()


def pixel_bytes(batches: int) -> list[float]:
    """Bytes of compact / standard batches of the pixel env (same seed, same frames)."""
    ratios = []
    runs = []
    for store_obs_once in (False, True):
        torch.manual_seed(0)
        collector = Collector(pixels(), None, frames_per_batch=100, store_obs_once=store_obs_once)
        runs.append([batch.bytes() for batch in itertools.islice(collector, batches)])
        collector.shutdown()
    for standard, compact in zip(*runs, strict=True):
        ratios.append(compact / standard)
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--frames", type=int, default=None, help="timed frames per run")
    parser.add_argument("--only", nargs="*", default=None, help="case names to run")
    arguments = parser.parse_args()
    rounds = arguments.rounds or (1 if arguments.quick else 5)
    frames = arguments.frames or (2_000 if arguments.quick else 20_000)
    cases = [case for case in CASES if arguments.only is None or case in arguments.only]
    torch.set_num_threads(1)

    results: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    for round_ in range(rounds):
        for case in cases:
            order = (False, True) if round_ % 2 == 0 else (True, False)
            for store_obs_once in order:
                speed = frames_per_second(case, store_obs_once, frames)
                results.setdefault((case, store_obs_once), []).append(speed)

    print(f"{rounds} round(s) of {frames} frames, frames_per_batch={FRAMES_PER_BATCH}")
    print(
        f"{'case':<24}{'standard f/cpu-s':>18}{'compact f/cpu-s':>17}"
        f"{'compact / standard [min, max]':>32}{'wall f/s std / compact':>26}"
    )
    for case in cases:
        standard, compact = results[case, False], results[case, True]
        ratios = [c[0] / s[0] for c, s in zip(compact, standard, strict=True)]
        wall = f"{statistics.median(s[1] for s in standard):.0f} / "
        wall += f"{statistics.median(c[1] for c in compact):.0f}"
        print(
            f"{case:<24}{statistics.median(s[0] for s in standard):>18.0f}"
            f"{statistics.median(c[0] for c in compact):>17.0f}"
            f"{statistics.median(ratios):>16.3f} [{min(ratios):.3f}, {max(ratios):.3f}]"
            f"{wall:>26}"
        )
    ratios = pixel_bytes(batches=3 if arguments.quick else 10)
    print(
        f"84x84x3 uint8, 100-frame batches, 30-step episodes: compact bytes / standard bytes "
        f"= {max(ratios):.3f} at most ({statistics.mean(ratios):.3f} on average)"
    )


if __name__ == "__main__":
    main()

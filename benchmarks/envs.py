"""Env stepping throughput, side by side: our envs' buffer face vs plain Gymnasium loops.

Random actions, CartPole-v1, one process and one torch thread. Our envs step through the buffer
face the collectors use (`bind(carrier)`, then `step_and_advance_into(t)`); each timed pass first
draws its random actions from the action spec into the carrier, in one call. The plain Gymnasium
loops sample theirs from the action space at each step, as such loops are written. A reference
loop steps Gymnasium with actions drawn before the pass: our ratio against it is the cost of the
wrapper alone (no target). The cases run interleaved, `--repeats` times each, and the best pass
of each counts, so that other load on the machine hurts every case alike.

    python benchmarks/envs.py            # full run (~1 minute on 2 cores)
    python benchmarks/envs.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import torch

from rlcollect import keys
from rlcollect.envs import GymEnv, GymVectorEnv, ParallelEnv, SerialEnv, allocate_carrier
from rlcollect.envs.base import EnvBase

ENV_ID = "CartPole-v1"
NUM_ENVS = 8

Runner = Callable[[], int]  # runs one pass, returns the number of frames it stepped


@dataclass
class Case:
    """One measured loop; `baseline` names the case its ratio is taken against."""

    name: str
    runner: Runner
    baseline: str | None = None
    target: float | None = None
    reference: str | None = None
    best: float = 0.0
    close: Callable[[], None] | None = None


# --- runners ----------------------------------------------------------------------------------


def gymnasium_loop(frames: int) -> Runner:
    """The plain loop: `env.step(env.action_space.sample())`, reset when done."""
    env = gym.make(ENV_ID)
    env.reset(seed=0)
    env.action_space.seed(0)

    def run() -> int:
        step, sample, reset = env.step, env.action_space.sample, env.reset
        for _ in range(frames):
            _, _, terminated, truncated, _ = step(sample())
            if terminated or truncated:
                reset()
        return frames

    return run


def gymnasium_loop_drawn_in_advance(frames: int) -> Runner:
    """The plain loop with its random actions drawn before the pass: env stepping alone."""
    env = gym.make(ENV_ID)
    env.reset(seed=0)
    env.action_space.seed(0)
    actions = [env.action_space.sample() for _ in range(frames)]

    def run() -> int:
        step, reset = env.step, env.reset
        for action in actions:
            _, _, terminated, truncated, _ = step(action)
            if terminated or truncated:
                reset()
        return frames

    return run


def sync_vector_loop(frames: int, num_envs: int) -> Runner:
    """`SyncVectorEnv(num_envs)` stepped with batched random actions (same-step autoreset)."""
    env = gym.vector.SyncVectorEnv(
        [lambda: gym.make(ENV_ID)] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    env.reset(seed=0)
    env.action_space.seed(0)
    steps = max(1, frames // num_envs)

    def run() -> int:
        step, sample = env.step, env.action_space.sample
        for _ in range(steps):
            step(sample())
        return steps * num_envs

    return run


def buffer_face_loop(env: EnvBase, frames: int) -> Runner:
    """Our env stepping into a carrier; each pass draws its random actions into it first."""
    batch = env.batch_size.numel()
    steps = max(1, frames // batch)
    carrier = allocate_carrier(env.full_spec, steps=steps)
    env.set_seed(0)
    env.bind(carrier)
    # after bind: ParallelEnv moved the carrier to shared memory, so write into it in place
    action_rows = carrier.get(keys.ACTION)
    time_dim = len(env.batch_size)

    def run() -> int:
        action_rows.copy_(env.action_spec.rand((steps + 1,)).movedim(0, time_dim))
        env.reset_into(0)
        step_and_advance_into = env.step_and_advance_into
        for t in range(steps):
            step_and_advance_into(t)
        return steps * batch

    return run


# --- measurement ------------------------------------------------------------------------------


def build_cases(frames: int) -> list[Case]:
    gym_env = GymEnv(ENV_ID)
    serial = SerialEnv(NUM_ENVS, ENV_ID)
    vector = GymVectorEnv(ENV_ID, num_envs=NUM_ENVS)
    parallel = ParallelEnv(2, ENV_ID)
    parallel_serial = ParallelEnv(2, lambda: SerialEnv(NUM_ENVS // 2, ENV_ID))
    loop, sync = "gymnasium loop (1 env)", f"SyncVectorEnv({NUM_ENVS})"
    drawn = "gymnasium loop, actions drawn in advance"
    return [
        Case(loop, gymnasium_loop(frames)),
        Case(drawn, gymnasium_loop_drawn_in_advance(frames)),
        Case(
            "GymEnv (buffer face)",
            buffer_face_loop(gym_env, frames),
            baseline=loop,
            target=0.9,
            reference=drawn,
            close=gym_env.close,
        ),
        Case(sync, sync_vector_loop(frames, NUM_ENVS)),
        Case(
            f"SerialEnv({NUM_ENVS})",
            buffer_face_loop(serial, frames),
            baseline=sync,
            target=0.9,
            close=serial.close,
        ),
        Case(
            f"GymVectorEnv({NUM_ENVS})",
            buffer_face_loop(vector, frames),
            baseline=sync,
            close=vector.close,
        ),
        Case(
            "ParallelEnv(2)",
            buffer_face_loop(parallel, frames),
            baseline=loop,
            close=parallel.close,
        ),
        Case(
            f"ParallelEnv(2 x SerialEnv({NUM_ENVS // 2}))",
            buffer_face_loop(parallel_serial, frames),
            baseline=sync,
            close=parallel_serial.close,
        ),
    ]


def measure(cases: list[Case], repeats: int) -> None:
    """Run every case `repeats` times, interleaved; keep each case's best frames/s."""
    for case in cases:
        case.runner()  # warm-up: first resets, lazy allocations, page faults
    for _ in range(repeats):
        for case in cases:
            started = time.perf_counter()
            frames = case.runner()
            case.best = max(case.best, frames / (time.perf_counter() - started))


def report(cases: list[Case]) -> None:
    by_name = {case.name: case for case in cases}
    print(f"{'case':<42} {'frames/s':>10} {'ratio':>7}  {'vs':<24} {'target':>7}")
    for case in cases:
        ratio, versus, verdict = "", "", ""
        if case.baseline is not None:
            value = case.best / by_name[case.baseline].best
            ratio, versus = f"{value:.2f}x", case.baseline
            if case.target is not None:
                met = "met" if value >= case.target else "MISSED"
                verdict = f">={case.target:.1f}x {met}"
        print(f"{case.name:<42} {case.best:>10,.0f} {ratio:>7}  {versus:<24} {verdict}")
    for case in cases:
        if case.reference is not None:
            value = case.best / by_name[case.reference].best
            print(f"{case.name} vs {case.reference}: {value:.2f}x (the wrapper's own cost)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--frames", type=int, default=20_000, help="frames per pass")
    parser.add_argument("--repeats", type=int, default=7, help="passes per case")
    args = parser.parse_args()
    frames, repeats = (400, 1) if args.quick else (args.frames, args.repeats)
    torch.set_num_threads(1)
    cases = build_cases(frames)
    try:
        measure(cases, repeats)
    finally:
        for case in cases:
            if case.close is not None:
                case.close()
    print(f"{ENV_ID}, random actions, {frames} frames per pass, best of {repeats} passes")
    report(cases)


if __name__ == "__main__":
    main()

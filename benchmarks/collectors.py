"""Collector throughput, side by side: rlcollect vs TorchRL vs a plain Gymnasium loop.

Every (case, implementation) pair runs in its own subprocess, so that each reports its own
peak RSS and none warms another's caches. Prints a table of frames/s and the ratios the
collector issue asks for.

    python benchmarks/collectors.py            # full run, 5 interleaved rounds (~10 minutes)
    python benchmarks/collectors.py --quick    # smoke run (1 round, 2,000 frames)
    python benchmarks/collectors.py --quick --in-process  # the tests' smoke run, one process
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

FRAMES_PER_BATCH = 1000
NUM_ENVS = 8
T = TypeVar("T")  # what a measurement returns (run_here)


# --- policies (the same modules for every implementation) -----------------------------------


class SamplingPolicy(nn.Module):
    """MLP 4-64-64-2 that samples a one-hot action from its logits."""

    def __init__(self, observation_size: int = 4, actions: int = 2) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(observation_size, 64),
            nn.Tanh(),
            nn.Linear(64, 64),
            nn.Tanh(),
            nn.Linear(64, actions),
        )
        self.actions = actions

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        probabilities = self.net(observation).softmax(-1)
        index = torch.multinomial(probabilities.reshape(-1, self.actions), 1)
        index = index.reshape(probabilities.shape[:-1])
        return nn.functional.one_hot(index, self.actions)


class TanhPolicy(nn.Module):
    """MLP 3-64-64-1 with a tanh output scaled to Pendulum's torque range."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(3, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)
        )

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return 2.0 * torch.tanh(self.net(observation))


def policy_for(env_id: str) -> nn.Module:
    torch.manual_seed(0)
    return TanhPolicy() if env_id.startswith("Pendulum") else SamplingPolicy()


# --- implementations --------------------------------------------------------------------------


def plain_gym(env_id: str, num_envs: int, frames: int) -> float:
    import gymnasium as gym

    policy = policy_for(env_id)
    discrete = not env_id.startswith("Pendulum")
    if num_envs == 1:
        env = gym.make(env_id)
        observation, _ = env.reset(seed=0)
        start = time.perf_counter()
        with torch.no_grad():
            for _ in range(frames):
                output = policy(torch.as_tensor(observation))
                action = int(output.argmax()) if discrete else output.numpy()
                observation, _, terminated, truncated, _ = env.step(action)
                if terminated or truncated:
                    observation, _ = env.reset()
        return frames / (time.perf_counter() - start)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * num_envs)
    observation, _ = envs.reset(seed=0)
    # Frames are transitions, as our collectors count them: the step where an env that ended
    # only resets (Gymnasium's next-step autoreset) is none.
    collected, ended = 0, 0
    start = time.perf_counter()
    with torch.no_grad():
        while collected < frames:
            output = policy(torch.as_tensor(observation))
            action = output.argmax(-1).numpy() if discrete else output.numpy()
            observation, _, terminated, truncated, _ = envs.step(action)
            collected += num_envs - ended
            ended = int((terminated | truncated).sum())
    return collected / (time.perf_counter() - start)


def _torchrl_env(env_id: str, num_envs: int) -> Callable:
    from torchrl.envs import GymEnv, SerialEnv

    if num_envs == 1:
        return lambda: GymEnv(env_id)
    return lambda: SerialEnv(num_envs, lambda: GymEnv(env_id))


def _ours_env(env_id: str, num_envs: int) -> Callable:
    from rlcollect.envs import GymEnv

    if num_envs == 1:
        return lambda: GymEnv(env_id)
    from rlcollect.envs import SerialEnv

    return lambda: SerialEnv(num_envs, lambda: GymEnv(env_id))


def _time_collector(collector: object, frames: int) -> float:
    iterator = iter(collector)  # type: ignore[call-overload]
    next(iterator)  # warm-up batch, not timed
    start = time.perf_counter()
    collected = 0
    while collected < frames:
        next(iterator)
        collected += FRAMES_PER_BATCH
    return collected / (time.perf_counter() - start)


def _module(env_id: str) -> nn.Module:
    from tensordict.nn import TensorDictModule

    return TensorDictModule(policy_for(env_id), in_keys=["observation"], out_keys=["action"])


def torchrl_collector(env_id: str, num_envs: int, frames: int) -> float:
    from torchrl.collectors import Collector

    collector = Collector(
        _torchrl_env(env_id, num_envs)(),
        _module(env_id),
        frames_per_batch=FRAMES_PER_BATCH,
        total_frames=-1,
    )
    try:
        return _time_collector(collector, frames)
    finally:
        collector.shutdown()


def ours_collector(env_id: str, num_envs: int, frames: int) -> float:
    from rlcollect import Collector

    collector = Collector(
        _ours_env(env_id, num_envs)(),
        _module(env_id),
        frames_per_batch=FRAMES_PER_BATCH,
        total_frames=-1,
    )
    try:
        return _time_collector(collector, frames)
    finally:
        collector.shutdown()


def _time_background(collector: object, buffer: object, frames: int) -> float:
    collector.start()  # type: ignore[attr-defined]
    while buffer.write_count < FRAMES_PER_BATCH:  # type: ignore[attr-defined]
        time.sleep(0.001)
    first = buffer.write_count  # type: ignore[attr-defined]
    start = time.perf_counter()
    while buffer.write_count - first < frames:  # type: ignore[attr-defined]
        time.sleep(0.005)
    written = buffer.write_count - first  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - start
    collector.async_shutdown()  # type: ignore[attr-defined]
    return written / elapsed


def torchrl_start(env_id: str, num_envs: int, frames: int) -> float:
    from torchrl.collectors import Collector
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    buffer = ReplayBuffer(storage=LazyTensorStorage(100_000))
    collector = Collector(
        _torchrl_env(env_id, num_envs)(),
        _module(env_id),
        frames_per_batch=FRAMES_PER_BATCH,
        total_frames=-1,
        replay_buffer=buffer,
    )
    return _time_background(collector, buffer, frames)


def ours_start(env_id: str, num_envs: int, frames: int) -> float:
    from rlcollect import Collector

    try:
        from rlcollect.replay import LazyTensorStorage, ReplayBuffer
    except ImportError:  # replay package not there yet: TorchRL's buffer stands in
        from torchrl.data import LazyTensorStorage, ReplayBuffer

    buffer = ReplayBuffer(storage=LazyTensorStorage(100_000))
    collector = Collector(
        _ours_env(env_id, num_envs)(),
        _module(env_id),
        frames_per_batch=FRAMES_PER_BATCH,
        total_frames=-1,
        replay_buffer=buffer,
    )
    return _time_background(collector, buffer, frames)


IMPLEMENTATIONS: dict[str, Callable[[str, int, int], float]] = {
    "gym": plain_gym,
    "torchrl": torchrl_collector,
    "rlcollect": ours_collector,
    "torchrl-start": torchrl_start,
    "rlcollect-start": ours_start,
}

# case name -> (env id, num envs, implementations)
CASES = {
    "CartPole single": ("CartPole-v1", 1, ["gym", "torchrl", "rlcollect"]),
    "CartPole SerialEnv(8)": ("CartPole-v1", NUM_ENVS, ["gym", "torchrl", "rlcollect"]),
    "CartPole start()": ("CartPole-v1", 1, ["torchrl-start", "rlcollect-start"]),
    "Pendulum single": ("Pendulum-v1", 1, ["gym", "torchrl", "rlcollect"]),
}


def run_one(case: str, implementation: str, frames: int) -> dict[str, float]:
    torch.set_num_threads(1)
    env_id, num_envs, _ = CASES[case]
    fps = IMPLEMENTATIONS[implementation](env_id, num_envs, frames)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"fps": fps, "peak_rss_mib": peak_kib / 1024}


def import_times(modules: list[str], rounds: int) -> dict[str, float]:
    """Best wall time of `import module` in a fresh interpreter, modules interleaved."""
    best = dict.fromkeys(modules, float("inf"))
    for _ in range(rounds):
        for module in modules:
            code = (
                f"import time; s = time.perf_counter(); import {module}; "
                "print(time.perf_counter() - s)"
            )
            output = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True
            ).stdout
            best[module] = min(best[module], float(output.strip().splitlines()[-1]))
    return best


def run_subprocess(case: str, implementation: str, frames: int) -> dict[str, float] | str:
    """One measurement in a fresh interpreter: its result, or the tail of its error."""
    command = [sys.executable, __file__, "--case", case, "--impl", implementation]
    command += ["--frames", str(frames)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return done.stderr.strip()[-300:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def add_in_process_option(parser: argparse.ArgumentParser) -> None:
    """`--in-process`: the benchmark scripts' cheap smoke run (what the tests run)."""
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run every measurement in this interpreter (a smoke run: cheaper, but start-up "
        "and memory are not a fresh interpreter's)",
    )


def run_here(measurement: Callable[..., T], *arguments: Any) -> T | str:
    """One measurement in this interpreter (`--in-process`): its result, or its error,
    reported as FAILED as a subprocess's error is."""
    try:
        return measurement(*arguments)
    except Exception as err:
        return f"{type(err).__name__}: {err}"


def measure_case(
    case: str, frames: int, rounds: int, in_process: bool = False
) -> dict[str, dict[str, float]]:
    """Median and best frames/s (and largest peak RSS) of each implementation over
    interleaved rounds.

    The implementations of a case run in turn, round after round, so that a change in the
    machine's load hits them alike. The median round is what the ratios compare (the issues
    ask for it: one lucky round does not move it); the best is printed beside it.
    """
    _, _, implementations = CASES[case]
    run = functools.partial(run_here, run_one) if in_process else run_subprocess
    rates: dict[str, list[float]] = {}
    peak: dict[str, float] = {}
    for _ in range(rounds):
        for implementation in implementations:
            result = run(case, implementation, frames)
            if isinstance(result, str):
                print(f"{case:24} {implementation:16} FAILED: {result}")
                continue
            rates.setdefault(implementation, []).append(result["fps"])
            peak[implementation] = max(peak.get(implementation, 0.0), result["peak_rss_mib"])
    return {
        name: {"fps": statistics.median(fps), "best_fps": max(fps), "peak_rss_mib": peak[name]}
        for name, fps in rates.items()
    }


# (numerator prefix, denominator, target): the ratios the collector issue asks for
TARGETS = {
    "CartPole single": [("torchrl", 4.0), ("gym", 1.0)],
    "CartPole SerialEnv(8)": [("torchrl", 4.0), ("gym", 1.0)],
    "CartPole start()": [("torchrl-start", 4.0)],
    "Pendulum single": [("torchrl", 4.0)],
}


def print_ratios(results: dict[tuple[str, str], float]) -> None:
    """The ratios the collector issue asks for, and the ceiling the plain loop sets on them."""
    print("\nratios (target):")
    for case, targets in TARGETS.items():
        ours = next(i for i in CASES[case][2] if i.startswith("rlcollect"))
        for other, target in targets:
            if (case, ours) in results and (case, other) in results:
                ratio = results[case, ours] / results[case, other]
                verdict = "ok" if ratio >= target else "BELOW TARGET"
                print(f"  {case:24} {ours} / {other:14} {ratio:6.2f}x  (>= {target}x) {verdict}")
    print("\nceiling: what a collector costing nothing beyond the plain loop would reach:")
    for case, (_, _, implementations) in CASES.items():
        if "gym" in implementations and (case, "gym") in results and (case, "torchrl") in results:
            ceiling = results[case, "gym"] / results[case, "torchrl"]
            print(f"  {case:24} gym / torchrl          {ceiling:6.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--impl", help=argparse.SUPPRESS)
    parser.add_argument("--frames", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds per case")
    parser.add_argument("--only", nargs="*", default=None, help="run only these case names")
    add_in_process_option(parser)
    args = parser.parse_args()
    frames = args.frames or (2_000 if args.quick else 10_000)
    rounds = args.rounds or (1 if args.quick else 5)
    if args.case:
        print(json.dumps(run_one(args.case, args.impl, frames)))
        return
    print(
        f"frames per measurement: {frames}, median (and best) of {rounds} interleaved rounds, "
        f"frames_per_batch={FRAMES_PER_BATCH}, 1 thread"
    )
    print(f"{'case':24} {'impl':16} {'frames/s':>10} {'best':>10} {'peak RSS MiB':>13}")
    results: dict[tuple[str, str], float] = {}
    for case in CASES:
        if args.only and case not in args.only:
            continue
        for implementation, result in measure_case(case, frames, rounds, args.in_process).items():
            results[case, implementation] = result["fps"]
            print(
                f"{case:24} {implementation:16} {result['fps']:>10.0f} "
                f"{result['best_fps']:>10.0f} {result['peak_rss_mib']:>13.0f}"
            )
    print_ratios(results)
    if args.in_process:
        print("\nimport time: not measured (--in-process)")
        return
    print(f"\nimport time (s, best of {rounds}):")
    for module, seconds in import_times(["rlcollect", "torchrl.collectors"], rounds).items():
        print(f"  import {module:<22} {seconds:.2f}")


if __name__ == "__main__":
    main()

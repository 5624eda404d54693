"""Batched inference, side by side: rlcollect's AsyncBatchedCollector vs TorchRL's, and vs
rlcollect's MultiAsyncCollector (a policy copy in every worker).

CartPole-v1 with the benchmark MLP (`benchmarks/collectors.py`'s SamplingPolicy, 4-64-64-2),
2 to 8 env workers of one env each, the policy on the CPU. Every measurement runs in its own
fresh interpreter; frames/s are timed after one untimed warm-up batch.

Rows:
* `ours-thread`: our AsyncBatchedCollector, server thread in the collector's process, shared
  slots (the default);
* `torchrl-shm`: TorchRL's with the same kind of transport: process env workers, the
  shared-memory env exchange, a server thread in the collector's process;
* `ours-process`: ours with a server process (`InferenceServerConfig(service_backend=
  "process")`, a policy factory);
* `torchrl-process`: TorchRL's fastest, `transport="auto"` (process slots straight to a
  server process, a policy factory);
* `ours-multiasync`: our MultiAsyncCollector, the policy in every worker.

    python benchmarks/batched_inference.py            # full run (best of 3 interleaved rounds)
    python benchmarks/batched_inference.py --quick    # smoke run
Writes benchmarks/results/batched_inference.csv.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collectors import SamplingPolicy

ENV_ID = "CartPole-v1"
FRAMES_PER_BATCH = 1000
WORKERS = (2, 4, 8)
IMPLEMENTATIONS = (
    "ours-thread",
    "torchrl-shm",
    "ours-process",
    "torchrl-process",
    "ours-multiasync",
)
# Seconds a measurement may take before it is reported as failed (a hang, not a number).
MEASURE_TIMEOUT = 600
RESULTS = Path(__file__).resolve().parent / "results" / "batched_inference.csv"


def make_module() -> object:
    """The benchmark MLP as a TensorDict module (the same weights everywhere)."""
    from tensordict.nn import TensorDictModule

    torch.manual_seed(0)
    return TensorDictModule(SamplingPolicy(), in_keys=["observation"], out_keys=["action"])


def ours_env() -> object:
    from rlcollect.envs import GymEnv

    return GymEnv(ENV_ID)


def torchrl_env() -> object:
    from torchrl.envs import GymEnv

    return GymEnv(ENV_ID)


def build(implementation: str, workers: int) -> object:
    """The collector of `implementation` over `workers` env workers, endless."""
    from torchrl.modules.inference_server import InferenceServerConfig

    common = {"frames_per_batch": FRAMES_PER_BATCH, "total_frames": -1}
    if implementation == "ours-thread":
        from rlcollect.collectors import AsyncBatchedCollector

        return AsyncBatchedCollector(
            [ours_env] * workers, policy=make_module(), max_batch_size=workers, **common
        )
    if implementation == "ours-process":
        from rlcollect.collectors import AsyncBatchedCollector

        return AsyncBatchedCollector(
            [ours_env] * workers,
            policy_factory=make_module,
            server_config=InferenceServerConfig(service_backend="process", max_batch_size=workers),
            **common,
        )
    if implementation == "torchrl-shm":
        from torchrl.collectors import AsyncBatchedCollector

        return AsyncBatchedCollector(
            [torchrl_env] * workers,
            policy=make_module(),
            env_backend="multiprocessing",
            env_exchange="shm",
            transport="driver",
            max_batch_size=workers,
            **common,
        )
    if implementation == "torchrl-process":
        from torchrl.collectors import AsyncBatchedCollector

        return AsyncBatchedCollector(
            [torchrl_env] * workers,
            policy_factory=make_module,
            env_backend="multiprocessing",
            transport="auto",
            server_config=InferenceServerConfig(max_batch_size=workers),
            **common,
        )
    if implementation == "ours-multiasync":
        from rlcollect.collectors import MultiAsyncCollector

        return MultiAsyncCollector(
            [ours_env] * workers,
            make_module(),
            frames_per_batch=FRAMES_PER_BATCH // workers,
            total_frames=-1,
        )
    raise ValueError(f"unknown implementation {implementation!r}; use one of {IMPLEMENTATIONS}.")


def time_batches(collector: object, frames: int) -> dict[str, float]:
    """Frames/s over at least `frames` frames, after one untimed warm-up batch; the mean
    number of rows per server forward, where there is a server."""
    iterator = iter(collector)  # type: ignore[call-overload]
    next(iterator)
    start, collected = time.perf_counter(), 0
    while collected < frames:
        collected += next(iterator).numel()
    result = {"fps": collected / (time.perf_counter() - start)}
    stats = getattr(collector, "server_stats", None)
    if stats is not None:
        with_counts = stats()
        result["rows_per_forward"] = float(with_counts.get("avg_batch_size", float("nan")))
    collector.shutdown()  # type: ignore[attr-defined]
    return result


def run_subprocess(implementation: str, workers: int, frames: int) -> dict[str, float] | str:
    """One measurement in a fresh interpreter: its numbers, or why there are none."""
    command = [
        sys.executable,
        __file__,
        "--measure",
        implementation,
        "--workers",
        str(workers),
        "--frames",
        str(frames),
    ]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=MEASURE_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        return f"timed out after {MEASURE_TIMEOUT} s"
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)  # type: ignore[no-any-return]
    return f"failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}"


def measure(
    workers_list: list[int], names: list[str], frames: int, rounds: int
) -> dict[tuple[str, int], dict[str, float]]:
    """Best frames/s of `rounds` interleaved rounds for each implementation and worker count."""
    best: dict[tuple[str, int], dict[str, float]] = {}
    for round_index in range(rounds):
        for workers in workers_list:
            for name in names:
                result = run_subprocess(name, workers, frames)
                print(f"round {round_index + 1}: {name} x{workers}: {result}", flush=True)
                if isinstance(result, str):
                    continue
                if result["fps"] > best.get((name, workers), {"fps": 0.0})["fps"]:
                    best[(name, workers)] = result
    return best


def report(best: dict[tuple[str, int], dict[str, float]], workers_list: list[int]) -> None:
    """Print the frames/s table with the ratios the issue asks for, and write the CSV."""
    names = sorted({name for name, _ in best}, key=IMPLEMENTATIONS.index)
    print(f"\nframes/s, {ENV_ID}, benchmark MLP on the CPU, {os.cpu_count()} cores")
    print("workers | " + " | ".join(names) + " | ours/torchrl (thread) | ours/torchrl (process)")
    rows = []
    for workers in workers_list:
        values = {name: best.get((name, workers), {}).get("fps", float("nan")) for name in names}
        thread = values.get("ours-thread", float("nan")) / values.get("torchrl-shm", float("nan"))
        process = values.get("ours-process", float("nan")) / values.get(
            "torchrl-process", float("nan")
        )
        cells = " | ".join(f"{values[name]:,.0f}" for name in names)
        print(f"{workers} | {cells} | {thread:.2f}x | {process:.2f}x")
        for name in names:
            result = best.get((name, workers), {})
            rows.append(
                {
                    "workers": workers,
                    "implementation": name,
                    "fps": round(result.get("fps", float("nan")), 1),
                    "rows_per_forward": round(result.get("rows_per_forward", float("nan")), 2),
                }
            )
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {RESULTS}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, nargs="*", default=None)
    parser.add_argument("--frames", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--only", nargs="*", default=None, help="implementations to run")
    args = parser.parse_args()
    frames = args.frames or (3_000 if args.quick else 20_000)
    if args.measure:
        warnings.simplefilter("ignore")
        torch.set_num_threads(1)
        collector = build(args.measure, args.workers[0])
        print(json.dumps(time_batches(collector, frames)), flush=True)
        os._exit(0)  # TorchRL's collectors may keep the interpreter alive after shutdown
    workers_list = args.workers or ([2, 4] if args.quick else list(WORKERS))
    rounds = args.rounds or (1 if args.quick else 3)
    names = args.only or list(IMPLEMENTATIONS)
    print(f"{frames} frames per measurement, best of {rounds} rounds, fpb={FRAMES_PER_BATCH}")
    report(measure(workers_list, names, frames, rounds), workers_list)


if __name__ == "__main__":
    main()

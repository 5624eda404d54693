"""Ray collectors, side by side: RayCollector (2 actors) vs MultiSyncCollector (2 workers) vs
TorchRL's RayCollector (2 actors), on CartPole-v1 with the benchmark MLP.

Every measurement runs in its own fresh interpreter on its own local Ray cluster (2 CPUs, started
before the clock runs). Prints frames/s, the time from construction to the first batch, the
per-batch overhead of the object store (a batch's wall time in the driver minus the time the
actors spent collecting it) and the raw put + get of one 1000-frame batch.

    python benchmarks/ray_collectors.py            # full run (best of 3 interleaved rounds)
    python benchmarks/ray_collectors.py --quick    # smoke run
    python benchmarks/ray_collectors.py --quick --in-process  # the tests' smoke run, one process

With `RAY_ADDRESS` set (Ray's own variable: a running cluster's address), the measurements join
that cluster instead of starting their own (the tests' smoke run joins the test run's).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collectors import FRAMES_PER_BATCH, add_in_process_option, run_here
from multi_collectors import module, ours_env, ours_sync, torchrl_env

# Seconds a measurement may take before it is reported as failed (a hang, not a number).
MEASURE_TIMEOUT = 300
RAY_INIT = {
    "num_cpus": 2,
    "include_dashboard": False,
    "object_store_memory": 300 * 1024**2,
    "log_to_driver": False,
}


def start_ray() -> dict[str, float]:
    """Start the measurement's local cluster, or join the one at `RAY_ADDRESS`:
    `{"ray_init_s": seconds}`, or nothing when this process is on a cluster already (the later
    measurements of an `--in-process` run)."""
    import ray

    if ray.is_initialized():
        return {}
    start = time.perf_counter()
    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=False)
    else:
        ray.init(**RAY_INIT)
    return {"ray_init_s": time.perf_counter() - start}


def ours_ray() -> Any:
    from rlcollect.collectors import RayCollector

    return RayCollector(ours_env(1), module(), num_collectors=2, frames_per_batch=FRAMES_PER_BATCH)


def torchrl_ray() -> Any:
    from torchrl.collectors.distributed import RayCollector

    return RayCollector(
        [torchrl_env(1)] * 2,
        module(),
        frames_per_batch=FRAMES_PER_BATCH,
        total_frames=10**9,  # its iterator stops at once with -1 (endless elsewhere)
        sync=True,
        remote_configs={"num_cpus": 1, "num_gpus": None, "memory": 1024**3},
    )


def time_collector(build: Callable[[], Any], frames: int, ray: bool) -> dict[str, float]:
    """Frames/s over `frames` frames after the first batch, and the seconds from construction
    to the first batch (Ray's own start-up, when it runs, is reported apart)."""
    result = start_ray() if ray else {}
    start = time.perf_counter()
    collector = build()
    iterator = iter(collector)
    next(iterator)
    result["first_batch_s"] = time.perf_counter() - start
    start, collected, batches = time.perf_counter(), 0, 0
    while collected < frames:
        next(iterator)
        collected += FRAMES_PER_BATCH
        batches += 1
    elapsed = time.perf_counter() - start
    result["fps"] = collected / elapsed
    if hasattr(collector, "fleet"):  # ours: what the actors spent collecting, per batch
        actors = collector.stats()["collectors"]
        collecting = max(actor["collector"]["collect_seconds"] for actor in actors)
        per_batch = collecting / (batches + 1)
        result["overhead_ms"] = 1000 * (elapsed / batches - per_batch)
    collector.shutdown()
    return result


def object_store_round_trip(repeats: int = 50) -> dict[str, float]:
    """Seconds of `ray.put` + `ray.get` of one 1000-frame CartPole batch (a TensorDict)."""
    import ray

    start_ray()
    from rlcollect.collectors import Collector

    collector = Collector(ours_env(1)(), module(), frames_per_batch=FRAMES_PER_BATCH)
    batch = collector.next()
    collector.shutdown()
    ray.get(ray.put(batch))
    start = time.perf_counter()
    for _ in range(repeats):
        ray.get(ray.put(batch))
    return {"put_get_ms": 1000 * (time.perf_counter() - start) / repeats}


# Each measurement by name: its case, its implementation, and the function that runs it.
MEASUREMENTS: dict[str, tuple[str, str, Callable[[int], dict[str, float]]]] = {
    "ray rlcollect": (
        "2 x 1 CartPole",
        "rlcollect-ray",
        lambda f: time_collector(ours_ray, f, ray=True),
    ),
    "multisync rlcollect": (
        "2 x 1 CartPole",
        "rlcollect-mp",
        lambda f: time_collector(lambda: ours_sync(2, 1), f, ray=False),
    ),
    "ray torchrl": (
        "2 x 1 CartPole",
        "torchrl-ray",
        lambda f: time_collector(torchrl_ray, f, ray=True),
    ),
    "object store": ("1000-frame batch", "ray", lambda f: object_store_round_trip()),
}
# Each target: the case, ours, the other, the measure, whether higher wins.
RATIOS = [
    ("2 x 1 CartPole", "rlcollect-ray", "rlcollect-mp", "fps", True),
    ("2 x 1 CartPole", "rlcollect-ray", "torchrl-ray", "fps", True),
    ("2 x 1 CartPole", "rlcollect-ray", "torchrl-ray", "first_batch_s", False),
]


def run_subprocess(name: str, frames: int) -> dict[str, float] | str:
    command = [sys.executable, __file__, "--measure", name, "--frames", str(frames)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=MEASURE_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"no result within {MEASURE_TIMEOUT} s"
    if done.returncode != 0:
        return done.stderr.strip()[-600:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def measure(
    names: list[str], frames: int, rounds: int, in_process: bool = False
) -> dict[tuple[str, str], dict]:
    """Best result of each measurement over interleaved rounds (highest frames/s, lowest
    seconds), so that a change in the machine's load hits every implementation alike."""
    best: dict[tuple[str, str], dict[str, float]] = {}
    for _ in range(rounds):
        for name in names:
            case, implementation, _ = MEASUREMENTS[name]
            if in_process:
                result = run_here(MEASUREMENTS[name][2], frames)
            else:
                result = run_subprocess(name, frames)
            if isinstance(result, str):
                print(f"{case:18} {implementation:14} FAILED: {result}")
                continue
            kept = best.setdefault((case, implementation), result)
            for key, value in result.items():
                kept[key] = max(kept[key], value) if key == "fps" else min(kept[key], value)
    return best


def report(results: dict[tuple[str, str], dict[str, float]]) -> None:
    for (case, implementation), result in results.items():
        values = "  ".join(f"{key}={value:.4g}" for key, value in result.items())
        print(f"{case:18} {implementation:14} {values}")
    print("\nratios:")
    for case, ours, other, key, higher in RATIOS:
        if (case, ours) in results and (case, other) in results:
            ratio = results[case, ours][key] / results[case, other][key]
            better = "higher is better" if higher else "lower is better"
            print(f"  {case:16} {key:13} {ours} / {other:13} {ratio:6.2f}x ({better})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--frames", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--only", nargs="*", default=None, help="measurement names to run")
    add_in_process_option(parser)
    args = parser.parse_args()
    frames = args.frames or (2_000 if args.quick else 20_000)
    if args.measure:
        print(json.dumps(MEASUREMENTS[args.measure][2](frames)), flush=True)
        if "torchrl" in args.measure:
            os._exit(0)  # TorchRL's collectors may keep the interpreter from exiting
        return
    rounds = args.rounds or (1 if args.quick else 3)
    names = args.only or list(MEASUREMENTS)
    print(f"{frames} frames per measurement, best of {rounds} rounds, fpb={FRAMES_PER_BATCH}")
    report(measure(names, frames, rounds, args.in_process))


if __name__ == "__main__":
    main()

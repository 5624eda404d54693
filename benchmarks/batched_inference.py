"""Batched inference, side by side: rlcollect's AsyncBatchedCollector vs TorchRL's, and vs
rlcollect's MultiAsyncCollector (a policy copy in every worker).

Three cases, 2 to 16 env workers of one env each, the policy on the CPU (one torch thread):
* `small`: CartPole-v1 with the benchmark MLP (`benchmarks/collectors.py`'s SamplingPolicy,
  4-64-64-2);
* `large`: CartPole-v1 with the MLP widened to 4-1024-1024-2, where one batched forward should
  beat one forward per worker;
* `pixel`: 4x84x84 uint8 frames (`benchmarks/pixel_env.py`, a Gymnasium env both libraries
  build by id) with CleanRL's Nature CNN (`benchmarks/scaling.py`), 6 actions.

Every measurement runs in its own fresh interpreter: one untimed warm-up batch, then batches for
at least `--seconds`; each case keeps its best of `--rounds` interleaved rounds.

Rows:
* `ours-thread`: our AsyncBatchedCollector, server thread in the collector's process, shared
  slots (the default);
* `torchrl-shm`: TorchRL's with the same kind of transport: process env workers, the
  shared-memory env exchange, a server thread in the collector's process;
* `ours-process`: ours with a server process (`InferenceServerConfig(service_backend=
  "process")`, a policy factory);
* `torchrl-process`: TorchRL's fastest, `transport="auto"` (process slots straight to a
  server process, a policy factory);
* `ours-multiasync`: our MultiAsyncCollector, the policy in every worker;
* `ours-thread-x2`, `ours-process-x2` (pixel case): ours with `concurrent_forwards=2`, two
  forwards at once in the server.

    python benchmarks/batched_inference.py            # full run (about 40 minutes on 2 cores)
    python benchmarks/batched_inference.py --quick    # smoke run (one short round, <= 4 workers)
    python benchmarks/batched_inference.py --from-logs run1.txt run2.txt   # report saved logs

Writes benchmarks/results/batched_inference.csv and a plot, batched_inference.png (copied to
docs/img/ for the results page).
"""

from __future__ import annotations

import argparse
import ast
import csv
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collectors import SamplingPolicy
from torch import nn

CARTPOLE = "CartPole-v1"
FRAMES_PER_BATCH = 1000
IMPLEMENTATIONS = (
    "ours-thread",
    "torchrl-shm",
    "ours-process",
    "torchrl-process",
    "ours-multiasync",
)
# Ours with two forwards at once in the server (`concurrent_forwards=2`), for the CNN, whose
# one-frame forwards leave the second core idle.
CONCURRENT = ("ours-thread-x2", "ours-process-x2")
# Seconds a measurement may take before it is reported as failed (a hang, not a number).
MEASURE_TIMEOUT = 600
RESULTS = Path(__file__).resolve().parent / "results" / "batched_inference.csv"
PLOT = RESULTS.with_suffix(".png")
DOCS_PLOT = Path(__file__).resolve().parents[1] / "docs" / "img" / PLOT.name  # the results page
LARGE_WIDTH = 1024
# The cases: (policy, worker counts, implementations).
CASES = (
    ("small", (2, 4, 8, 16), IMPLEMENTATIONS),
    ("large", (4, 8), ("ours-thread", "torchrl-shm", "ours-multiasync")),
    ("pixel", (2, 4, 8, 16), IMPLEMENTATIONS + CONCURRENT),
)
CASE_TITLES = {
    "small": "CartPole, MLP 4-64-64-2",
    "large": "CartPole, MLP 4-1024-1024-2",
    "pixel": "4x84x84 uint8 frames, Nature CNN",
}


class LargeSamplingPolicy(SamplingPolicy):
    """The benchmark MLP widened to 4-1024-1024-2: a forward costs about as much for one row
    as for eight, which is where one batched forward should beat one per worker."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(4, LARGE_WIDTH),
            nn.Tanh(),
            nn.Linear(LARGE_WIDTH, LARGE_WIDTH),
            nn.Tanh(),
            nn.Linear(LARGE_WIDTH, 2),
        )


def make_module(size: str = "small") -> object:
    """The case's policy (benchmark MLP, its large variant, or the Nature CNN) as a TensorDict
    module, the same weights everywhere."""
    from scaling import NatureCNN
    from tensordict.nn import TensorDictModule

    torch.manual_seed(0)
    modules = {"small": SamplingPolicy, "large": LargeSamplingPolicy, "pixel": NatureCNN}
    return TensorDictModule(modules[size](), in_keys=["observation"], out_keys=["action"])


def env_id(size: str) -> str:
    if size != "pixel":
        return CARTPOLE
    from pixel_env import register

    return register()


def ours_env(size: str) -> object:
    from rlcollect.envs import GymEnv

    return GymEnv(env_id(size))


def torchrl_env(size: str) -> object:
    from torchrl.envs import GymEnv

    return GymEnv(env_id(size))


def build(implementation: str, workers: int, size: str = "small") -> object:
    """The collector of `implementation` over `workers` env workers, endless. Every server
    batches up to all workers and waits at most 1 ms (TorchRL's fast configuration)."""
    from torchrl.modules.inference_server import InferenceServerConfig

    common = {"frames_per_batch": FRAMES_PER_BATCH, "total_frames": -1}
    policy = functools.partial(make_module, size)
    ours = functools.partial(ours_env, size)
    theirs = functools.partial(torchrl_env, size)
    thread_config = InferenceServerConfig(max_batch_size=workers, timeout=0.001)
    process_config = InferenceServerConfig(
        service_backend="process", max_batch_size=workers, timeout=0.001
    )
    concurrent_forwards = 2 if implementation in CONCURRENT else 1
    if implementation in ("ours-thread", "ours-thread-x2"):
        from rlcollect.collectors import AsyncBatchedCollector

        return AsyncBatchedCollector(
            [ours] * workers,
            policy=policy(),
            server_config=thread_config,
            concurrent_forwards=concurrent_forwards,
            **common,
        )
    if implementation in ("ours-process", "ours-process-x2"):
        from rlcollect.collectors import AsyncBatchedCollector

        return AsyncBatchedCollector(
            [ours] * workers,
            policy_factory=policy,
            server_config=process_config,
            concurrent_forwards=concurrent_forwards,
            **common,
        )
    if implementation == "torchrl-shm":
        from torchrl.collectors import AsyncBatchedCollector

        return AsyncBatchedCollector(
            [theirs] * workers,
            policy=policy(),
            env_backend="multiprocessing",
            env_exchange="shm",
            transport="driver",
            server_config=thread_config,
            **common,
        )
    if implementation == "torchrl-process":
        from torchrl.collectors import AsyncBatchedCollector

        return AsyncBatchedCollector(
            [theirs] * workers,
            policy_factory=policy,
            env_backend="multiprocessing",
            transport="auto",
            server_config=thread_config,
            **common,
        )
    if implementation == "ours-multiasync":
        from rlcollect.collectors import MultiAsyncCollector

        return MultiAsyncCollector(
            [ours] * workers,
            policy(),
            frames_per_batch=FRAMES_PER_BATCH // workers,
            total_frames=-1,
        )
    raise ValueError(
        f"unknown implementation {implementation!r}; use one of {IMPLEMENTATIONS + CONCURRENT}."
    )


def time_batches(collector: object, seconds: float) -> dict[str, float]:
    """Frames/s over whole batches for at least `seconds`, after one untimed warm-up batch;
    the mean number of rows per server forward, where there is a server."""
    iterator = iter(collector)  # type: ignore[call-overload]
    next(iterator)
    start, collected = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        collected += next(iterator).numel()
    result = {"fps": collected / (time.perf_counter() - start)}
    stats = getattr(collector, "server_stats", None)
    if stats is not None:
        with_counts = stats()
        result["rows_per_forward"] = float(with_counts.get("avg_batch_size", float("nan")))
    collector.shutdown()  # type: ignore[attr-defined]
    return result


def run_subprocess(
    implementation: str, workers: int, size: str, seconds: float
) -> dict[str, float] | str:
    """One measurement in a fresh interpreter: its numbers, or why there are none."""
    command = [
        sys.executable,
        __file__,
        "--measure",
        implementation,
        "--workers",
        str(workers),
        "--policy",
        size,
        "--seconds",
        str(seconds),
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


Key = tuple[str, int, str]  # policy size, workers, implementation


def measure(cases: list[Key], seconds: float, rounds: int) -> dict[Key, dict[str, float]]:
    """Best frames/s of `rounds` interleaved rounds for each case."""
    best: dict[Key, dict[str, float]] = {}
    for round_index in range(rounds):
        for case in cases:
            size, workers, name = case
            result = run_subprocess(name, workers, size, seconds)
            print(f"round {round_index + 1}: {size} {name} x{workers}: {result}", flush=True)
            if isinstance(result, str):
                continue
            if result["fps"] > best.get(case, {"fps": 0.0})["fps"]:
                best[case] = result
    return best


LOG_LINE = re.compile(
    r"^round \d+: (?P<size>\w+) (?P<name>[\w-]+) x(?P<workers>\d+): (?P<result>\{.*\})$"
)


def best_from_logs(paths: list[str]) -> tuple[dict[Key, dict[str, float]], list[Key]]:
    """The best result of each case in the printed logs of earlier runs (one interrupted by a
    time limit, and one that measured the rest), with the cases in the order they appear."""
    best: dict[Key, dict[str, float]] = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            match = LOG_LINE.match(line.strip())
            if match is None:
                continue
            case = (match["size"], int(match["workers"]), match["name"])
            result = ast.literal_eval(match["result"])
            if result["fps"] > best.get(case, {"fps": 0.0})["fps"]:
                best[case] = result
    order = [
        (size, workers, name)
        for size, counts, names in CASES
        for workers in counts
        for name in names
        if (size, workers, name) in best
    ]
    return best, order


def ratio(best: dict[Key, dict[str, float]], size: str, workers: int, a: str, b: str) -> float:
    nan = {"fps": float("nan")}
    return best.get((size, workers, a), nan)["fps"] / best.get((size, workers, b), nan)["fps"]


def report(best: dict[Key, dict[str, float]], cases: list[Key]) -> None:
    """Print the frames/s tables with the ratios the issue asks for, write the CSV and plot."""
    print(f"\nframes/s, policy on the CPU, {os.cpu_count()} cores")
    for size in dict.fromkeys(case[0] for case in cases):
        names = list(dict.fromkeys(case[2] for case in cases if case[0] == size))
        print(f"\n{CASE_TITLES[size]}\nworkers | " + " | ".join(names))
        for workers in dict.fromkeys(case[1] for case in cases if case[0] == size):
            cells = [best.get((size, workers, name), {}).get("fps", float("nan")) for name in names]
            print(f"{workers} | " + " | ".join(f"{value:,.0f}" for value in cells))
        print(
            "ours-thread / torchrl-shm, ours-process / torchrl-process, ours-thread / multiasync"
            + (", the same with two concurrent forwards:" if size == "pixel" else ":")
        )
        for workers in dict.fromkeys(case[1] for case in cases if case[0] == size):
            line = (
                f"  x{workers}: {ratio(best, size, workers, 'ours-thread', 'torchrl-shm'):.2f}x, "
                f"{ratio(best, size, workers, 'ours-process', 'torchrl-process'):.2f}x, "
                f"{ratio(best, size, workers, 'ours-thread', 'ours-multiasync'):.2f}x"
            )
            if size == "pixel":
                line += (
                    f"; {ratio(best, size, workers, 'ours-thread-x2', 'torchrl-shm'):.2f}x, "
                    f"{ratio(best, size, workers, 'ours-process-x2', 'torchrl-process'):.2f}x, "
                    f"{ratio(best, size, workers, 'ours-thread-x2', 'ours-multiasync'):.2f}x"
                )
            print(line)
    rows = [
        {
            "policy": size,
            "workers": workers,
            "implementation": name,
            "fps": round(best.get((size, workers, name), {}).get("fps", float("nan")), 1),
            "rows_per_forward": round(
                best.get((size, workers, name), {}).get("rows_per_forward", float("nan")), 2
            ),
        }
        for size, workers, name in cases
    ]
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(best, cases)
    print(f"wrote {RESULTS} and {PLOT}")


def plot(best: dict[Key, dict[str, float]], cases: list[Key]) -> None:
    """Frames/s against env workers (log-log), one panel per case, one line per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(dict.fromkeys(case[0] for case in cases))
    figure, panels = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4.2), squeeze=False)
    for panel, size in zip(panels[0], sizes, strict=True):
        for name in dict.fromkeys(case[2] for case in cases if case[0] == size):
            points = [
                (workers, best[(size, workers, name)]["fps"])
                for s, workers, n in cases
                if (s, n) == (size, name) and (size, workers, name) in best
            ]
            if points:
                color = f"C{(IMPLEMENTATIONS + CONCURRENT).index(name)}"  # one per row
                panel.plot(*zip(*points, strict=True), marker="o", label=name, color=color)
        panel.set(xscale="log", yscale="log", xlabel="env workers", title=CASE_TITLES[size])
        panel.set_xticks(sorted({case[1] for case in cases if case[0] == size}))
        panel.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        panel.get_xaxis().set_minor_formatter(matplotlib.ticker.NullFormatter())
        panel.grid(True, which="both", alpha=0.3)
        panel.legend(fontsize=8)
    panels[0][0].set_ylabel("frames/s")
    figure.suptitle(f"Batched inference, policy on the CPU, {os.cpu_count()} cores")
    figure.tight_layout()
    figure.savefig(PLOT, dpi=110)
    plt.close(figure)
    DOCS_PLOT.parent.mkdir(exist_ok=True)
    shutil.copyfile(PLOT, DOCS_PLOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--policy", default="small", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=None, help="timed seconds per row")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--only", nargs="*", default=None, help="implementations to run")
    parser.add_argument("--sizes", nargs="*", default=None, help="policy sizes to run")
    parser.add_argument(
        "--from-logs", nargs="*", default=None, help="report the printed logs of earlier runs"
    )
    args = parser.parse_args()
    if args.from_logs:
        report(*best_from_logs(args.from_logs))
        return
    seconds = args.seconds or (2.0 if args.quick else 6.0)
    if args.measure:
        warnings.simplefilter("ignore")
        torch.set_num_threads(1)
        collector = build(args.measure, args.workers, args.policy)
        print(json.dumps(time_batches(collector, seconds)), flush=True)
        os._exit(0)  # TorchRL's collectors may keep the interpreter alive after shutdown
    cases = [
        (size, workers, name)
        for size, counts, names in CASES
        for workers in counts
        for name in names
        if (args.only is None or name in args.only)
        and (args.sizes is None or size in args.sizes)
        and not (args.quick and workers > 4)
    ]
    rounds = args.rounds or (1 if args.quick else 2)
    print(f"{seconds} s per measurement, best of {rounds} rounds, fpb={FRAMES_PER_BATCH}")
    report(measure(cases, seconds, rounds), cases)


if __name__ == "__main__":
    main()

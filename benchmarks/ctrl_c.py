"""Ctrl-C: seconds from SIGINT in a collector's parent to every process of ours gone.

Each case runs a collector in a fresh interpreter (this script with `--run CASE`), which
collects until it is interrupted. Once it has handed back its first batches, the driver notes
every process below it (workers, fork servers, resource trackers, Ray's daemons and actors),
sends SIGINT to the parent (as `kill -INT`; `--group` sends it to the whole process group, as
Ctrl-C in a terminal does) and times the parent's exit and the last of those processes' end.
Idle, and beside one or two CPU burners (`python -c "while True: pass"`, started before the
collector and stopped by pid after), so that start-up and shutdown both run on a busy machine.
Prints a table and writes `benchmarks/results/ctrl_c.csv`, with the 1-minute load average
read when the signal was sent.

    python benchmarks/ctrl_c.py                  # every case, idle, 1 and 2 burners, 2 rounds
    python benchmarks/ctrl_c.py --quick          # smoke run: plain MultiSync, idle, once
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
# Seconds the collector may take to start and hand back its first batches (a busy machine).
START_TIMEOUT = 300
# Seconds after SIGINT before what is left is killed and the case reported as not done.
EXIT_TIMEOUT = 60
# Seconds it collects before the signal, so that batches are in flight.
COLLECT_SECONDS = 1.0
BURNER = "while True: pass"
CASES = ("nested MultiSync 2x2", "MultiSync 2", "MultiAsync 2", "RayCollector 2")


# --- the collector side (run with --run) ---------------------------------------------------


def build(case: str) -> object:
    from functools import partial

    from rlcollect.collectors import MultiAsyncCollector, MultiSyncCollector, RayCollector

    options = {"frames_per_batch": 400}
    if case == "nested MultiSync 2x2":
        inner = partial(MultiSyncCollector, num_workers=2)
        return MultiSyncCollector("CartPole-v1", num_workers=2, collector_class=inner, **options)
    if case == "MultiSync 2":
        return MultiSyncCollector("CartPole-v1", num_workers=2, **options)
    if case == "MultiAsync 2":
        return MultiAsyncCollector("CartPole-v1", num_workers=2, **options)
    ray_init = {"num_cpus": 2, "include_dashboard": False, "log_to_driver": False}
    return RayCollector("CartPole-v1", num_collectors=2, ray_init_config=ray_init, **options)


def collect_until_interrupted(case: str) -> None:
    """Collect forever; say "ready" after the first batches (a KeyboardInterrupt ends it)."""
    # Python's Ctrl-C handler, even when the driver runs in the background (`cmd &`), whose
    # children inherit an ignored SIGINT.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    collector = build(case)
    for index, _ in enumerate(collector):
        if index == 2:
            print("ready", flush=True)


# --- the driver ----------------------------------------------------------------------------


def process_parents() -> dict[int, int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def descendants(root: int) -> set[int]:
    """Every live process below `root`."""
    parents = process_parents()
    found, frontier = set(), [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in found]
        found.update(children)
        frontier.extend(children)
    return found


def running(pids: set[int]) -> set[int]:
    """The processes of `pids` that still run (a zombie has ended)."""
    alive = set()
    for pid in pids:
        with contextlib.suppress(OSError, IndexError):
            if (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z":
                alive.add(pid)
    return alive


@contextlib.contextmanager
def burners(count: int) -> Iterator[None]:
    """`count` busy loops beside the measurement, stopped by pid afterwards."""
    started = [subprocess.Popen([sys.executable, "-c", BURNER]) for _ in range(count)]
    try:
        yield
    finally:
        for burner in started:
            burner.kill()
            burner.wait()


def kill_all(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def measure(case: str, group: bool) -> dict[str, object]:
    """Start `case`, interrupt it once it collects; seconds to the parent's exit and to the
    end of every process below it."""
    with tempfile.TemporaryFile("w+") as errors:  # a pipe nobody reads would block its writers
        return interrupt(case, group, errors)


def interrupt(case: str, group: bool, errors: IO[str]) -> dict[str, object]:
    process = subprocess.Popen(
        [sys.executable, __file__, "--run", case],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
        start_new_session=True,
    )
    started = time.monotonic()
    ours: set[int] = set()
    try:
        line = process.stdout.readline() if process.stdout else ""
        if line.strip() != "ready":
            errors.seek(0)
            raise RuntimeError(f"{case} did not start: {errors.read()[-1500:]}")
        start_s = time.monotonic() - started
        time.sleep(COLLECT_SECONDS)
        ours = descendants(process.pid)
        load = os.getloadavg()[0]
        sent = time.monotonic()
        if group:
            os.killpg(process.pid, signal.SIGINT)
        else:
            process.send_signal(signal.SIGINT)
        parent_s = all_s = None
        while time.monotonic() - sent < EXIT_TIMEOUT:
            if parent_s is None and process.poll() is not None:
                parent_s = time.monotonic() - sent
            if parent_s is not None and not running(ours):
                all_s = time.monotonic() - sent
                break
            time.sleep(0.01)
        left = running(ours)
    finally:
        process.kill()
        process.wait()
    kill_all(running(ours))
    return {
        "start_s": start_s,
        "load": load,
        "parent_s": parent_s,
        "all_s": all_s,
        "processes": len(ours),
        "left": len(left),
    }


def seconds(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, float) else f">{EXIT_TIMEOUT}"


def summary(rows: list[dict[str, object]]) -> None:
    print(
        f"{'case':<22}{'burners':>8}{'load1':>7}{'start_s':>9}{'parent_s':>10}{'all_s':>8}"
        f"{'max all_s':>11}{'procs':>7}"
    )
    keys = sorted({(row["case"], row["burners"]) for row in rows}, key=str)
    for case, count in keys:
        chosen = [row for row in rows if (row["case"], row["burners"]) == (case, count)]
        ended = [row["all_s"] for row in chosen if isinstance(row["all_s"], float)]
        parents = [row["parent_s"] for row in chosen if isinstance(row["parent_s"], float)]
        median_all = statistics.median(ended) if len(ended) == len(chosen) else None
        worst = max(ended) if len(ended) == len(chosen) else None
        median_parent = statistics.median(parents) if len(parents) == len(chosen) else None
        print(
            f"{case:<22}{count:>8}{statistics.mean(r['load'] for r in chosen):>7.1f}"
            f"{statistics.median(r['start_s'] for r in chosen):>9.1f}"
            f"{seconds(median_parent):>10}{seconds(median_all):>8}{seconds(worst):>11}"
            f"{max(r['processes'] for r in chosen):>7}"
        )


def rounded(value: object) -> object:
    return round(value, 3) if isinstance(value, float) else value


def write_csv(path: Path, rows: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = ["case", "burners", "signal", "load", "start_s", "parent_s", "all_s", "processes"]
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({key: rounded(row[key]) for key in fields})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="plain MultiSync, idle, once")
    parser.add_argument("--only", nargs="+", choices=CASES, help="these cases only")
    parser.add_argument("--burners", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--group", action="store_true", help="SIGINT to the process group")
    parser.add_argument("--csv", type=Path, default=RESULTS / "ctrl_c.csv")
    parser.add_argument("--run", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        collect_until_interrupted(args.run)
        return
    cases = ["MultiSync 2"] if args.quick else list(args.only or CASES)
    counts, rounds = ([0], 1) if args.quick else (args.burners, args.rounds)
    rows = []
    for _ in range(rounds):
        for count in counts:
            with burners(count):
                for case in cases:
                    row = {
                        "case": case,
                        "burners": count,
                        "signal": "group" if args.group else "parent",
                        **measure(case, args.group),
                    }
                    print(f"  {case}, {count} burners: {row}", flush=True)
                    rows.append(row)
    summary(rows)
    if not args.quick:
        write_csv(args.csv, rows)
        print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()

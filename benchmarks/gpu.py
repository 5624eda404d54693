"""Policy on the GPU, env on the CPU: rlcollect's Collector vs TorchRL's vs a hand-written loop.

Three cases of 8 envs on the CPU, the policy on `--device` (CUDA when there is one), batches
stored on the CPU (the env's device):
* CartPole-v1 with the benchmark MLP (`collectors.SamplingPolicy`, 4-64-64-2);
* CartPole-v1 with a wide MLP, 4-1024-1024-1024-2;
* 4x84x84 uint8 frames with CleanRL's Nature CNN (`scaling.NatureCNN`): Pong-v5 through EnvPool
  when EnvPool is importable, else `pixel_env.py`'s synthetic frames (the EnvPool wheel and its
  Atari assets are far over what can be carried to a GPU machine); `--pixel` picks one.

Rows of each case:
* `hand loop`: plain PyTorch and a Gymnasium `SyncVectorEnv` (EnvPool for Pong): observation
  to the device, forward, action back to the CPU, step; eager;
* `rlcollect`: our `Collector` over `SerialEnv(8, ...)` (`EnvPoolEnv` for Pong),
  `policy_device=<device>, env_device="cpu", storing_device="cpu"`, with and without
  `cudagraph_policy=True`;
* `torchrl`: TorchRL's `Collector` over its `SerialEnv` (`MultiThreadedEnv` for Pong), the same
  devices, with and without `cudagraph_policy=True`.

A CUDA-graph row without CUDA reads "n/a (no CUDA)"; TorchRL's rows read "n/a (torchrl
missing)" when it is not importable; a row that raises records its error and the run goes on
(exit status 1 only when every row failed). All rows run in this interpreter, one torch thread,
in interleaved rounds (every row once per round, so that a change in the machine's load hits
them alike); each row keeps its best round. A row times `--frames` frames (pixel rows a fifth)
after one untimed warm-up batch (the first calls, and the CUDA graph's capture), stopping early
after `--row-seconds`. On CUDA each row records `torch.cuda.max_memory_allocated`, construction
included. Writes `gpu_benchmark.json` and `gpu_benchmark.md` (the table) to `--out` after every
round, so that a run cut short keeps its finished rounds; a row still running after
ROW_TIMEOUT seconds is interrupted (when it hangs in Python code). Distributions' argument
checks are off for every row: a host sync per step, which CUDA-graph capture refuses.

    python benchmarks/gpu.py --out DIR                # on one H200: about 2-3 minutes
    python benchmarks/gpu.py --device cpu --quick     # the dry run (and the tests' smoke run)
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import importlib.util
import json
import os
import signal
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collectors import SamplingPolicy
from scaling import ActionIndex, NatureCNN, register_gymnasium_spaces
from torch import nn

NUM_ENVS = 8
PONG = "Pong-v5"
WIDE = 1024
PIXEL_SHARE = 0.2  # of `--frames` for the pixel rows, whose steps cost more
RESULTS = Path(__file__).resolve().parent / "results"
NO_CUDA = "n/a (no CUDA)"
NO_TORCHRL = "n/a (torchrl missing)"
HAND = "hand loop"
ROW_TIMEOUT = 120  # seconds before a hung row is interrupted (construction and timing together)
# (implementation, cudagraph_policy), in the order each round runs them
ROWS = (
    (HAND, False),
    ("rlcollect", False),
    ("rlcollect", True),
    ("torchrl", False),
    ("torchrl", True),
)


# --- cases ------------------------------------------------------------------------------------


class WideSamplingPolicy(SamplingPolicy):
    """The benchmark MLP with 3 hidden layers of 1024 (4-1024-1024-1024-2): enough work per
    forward for the device to matter."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(4, WIDE),
            nn.Tanh(),
            nn.Linear(WIDE, WIDE),
            nn.Tanh(),
            nn.Linear(WIDE, WIDE),
            nn.Tanh(),
            nn.Linear(WIDE, 2),
        )


@dataclass(frozen=True)
class Case:
    """One env and policy; `envpool` cases step Pong through EnvPool."""

    env: str  # as the table names it
    policy: str
    env_id: str
    make_policy: Callable[[], nn.Module]
    frames_per_batch: int
    frame_share: float = 1.0
    envpool: bool = False

    def seeded_policy(self) -> nn.Module:
        """The same weights in every row."""
        torch.manual_seed(0)
        return self.make_policy()


def pixel_case(choice: str) -> Case:
    """Pong through EnvPool (`pong`, or `auto` when EnvPool is importable), else the frames."""
    has_envpool = importlib.util.find_spec("envpool") is not None
    if choice == "pong" or (choice == "auto" and has_envpool):
        return Case(
            f"{PONG} x{NUM_ENVS} (EnvPool)", "Nature CNN", PONG, NatureCNN, 400, PIXEL_SHARE, True
        )
    if choice == "auto":
        print(
            "pixel case: EnvPool is not importable (its wheel and Atari assets are too large "
            "to carry here): synthetic 4x84x84 uint8 frames (benchmarks/pixel_env.py) "
            "instead of Pong"
        )
    from pixel_env import register

    return Case(f"StackedFrames x{NUM_ENVS}", "Nature CNN", register(), NatureCNN, 400, PIXEL_SHARE)


def make_cases(pixel: str) -> list[Case]:
    return [
        Case(f"CartPole-v1 x{NUM_ENVS}", "MLP 4-64-64-2", "CartPole-v1", SamplingPolicy, 1000),
        Case(
            f"CartPole-v1 x{NUM_ENVS}", f"MLP 4-{WIDE}x3-2", "CartPole-v1", WideSamplingPolicy, 1000
        ),
        pixel_case(pixel),
    ]


def env_threads() -> int:
    """EnvPool's threads: one per env, as far as the cores go."""
    return min(NUM_ENVS, os.cpu_count() or 1)


# --- hand-written loop ------------------------------------------------------------------------


def hand_env(case: Case) -> tuple[Any, Any]:
    """The hand loop's vector env, reset, and its first observation."""
    if case.envpool:
        import envpool

        threads = env_threads()
        envs = envpool.make(PONG, "gymnasium", num_envs=NUM_ENVS, num_threads=threads, seed=0)
        return envs, envs.reset()[0]  # EnvPool is seeded at construction
    import gymnasium as gym

    envs = gym.vector.SyncVectorEnv([functools.partial(gym.make, case.env_id)] * NUM_ENVS)
    return envs, envs.reset(seed=0)[0]


def hand_steps(
    envs: Any, observation: Any, policy: nn.Module, device: torch.device
) -> Iterator[int]:
    """Step the vector env (next-step autoreset, Gymnasium's and EnvPool's) with the policy,
    yielding the transitions of each step: an env that ended at the step before only resets
    in this one, which is no transition (as our collectors and TorchRL's count frames)."""
    ended = 0
    with torch.inference_mode():
        while True:
            output = policy(torch.as_tensor(observation).to(device))
            action = output.argmax(-1).cpu().numpy()
            observation, _, terminated, truncated, _ = envs.step(action)
            yield len(action) - ended
            ended = int((terminated | truncated).sum())


def hand_loop(case: Case, device: torch.device, frames: int, warmup: int, seconds: float) -> float:
    """Frames/s of the plain loop, after `warmup` untimed frames."""
    envs, observation = hand_env(case)
    steps = hand_steps(envs, observation, case.seeded_policy().to(device), device)
    try:
        collected = 0
        while collected < warmup:
            collected += next(steps)
        start, collected = time.perf_counter(), 0
        while collected < frames and (collected == 0 or time.perf_counter() - start < seconds):
            collected += next(steps)
        synchronize(device)
        return collected / (time.perf_counter() - start)
    finally:
        steps.close()
        envs.close()


# --- collectors -------------------------------------------------------------------------------


def policy_module(case: Case, env: Any, device: torch.device) -> nn.Module:
    """The case's policy as a TensorDict module on `device`, giving an index for envs with
    categorical actions (EnvPool's) and a one-hot action otherwise."""
    from tensordict.nn import TensorDictModule

    policy = case.seeded_policy()
    if type(env.action_spec).__name__ == "Categorical":
        policy = ActionIndex(policy)
    module = TensorDictModule(policy, in_keys=["observation"], out_keys=["action"])
    return module.to(device)


def collector_options(device: torch.device, cudagraph: bool, batch: int) -> dict[str, Any]:
    return {
        "frames_per_batch": batch,
        "total_frames": -1,
        "env_device": "cpu",
        "policy_device": device,
        "storing_device": "cpu",
        "cudagraph_policy": cudagraph,
    }


def ours_collector(case: Case, device: torch.device, cudagraph: bool, batch: int) -> Any:
    from rlcollect import Collector
    from rlcollect.envs import EnvPoolEnv, GymEnv, SerialEnv

    if case.envpool:
        env = EnvPoolEnv(PONG, num_envs=NUM_ENVS, num_threads=env_threads())
    else:
        env = SerialEnv(NUM_ENVS, functools.partial(GymEnv, case.env_id))
    module = policy_module(case, env, device)
    return Collector(env, module, **collector_options(device, cudagraph, batch))


def torchrl_collector(case: Case, device: torch.device, cudagraph: bool, batch: int) -> Any:
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv, MultiThreadedEnv, SerialEnv

    if case.envpool:
        register_gymnasium_spaces()
        threads = {"num_threads": env_threads()}
        env = MultiThreadedEnv(NUM_ENVS, PONG, create_env_kwargs=threads)
    else:
        env = SerialEnv(NUM_ENVS, functools.partial(GymEnv, case.env_id))
    module = policy_module(case, env, device)
    return Collector(env, module, **collector_options(device, cudagraph, batch))


COLLECTORS = {"rlcollect": ours_collector, "torchrl": torchrl_collector}


def time_collector(collector: Any, frames: int, device: torch.device, seconds: float) -> float:
    """Frames/s over whole batches, after one untimed warm-up batch."""
    iterator = iter(collector)
    next(iterator)
    start, collected = time.perf_counter(), 0
    while collected < frames and (collected == 0 or time.perf_counter() - start < seconds):
        collected += next(iterator).numel()
    synchronize(device)
    return collected / (time.perf_counter() - start)


# --- measuring --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    device: torch.device
    frames: int
    rounds: int
    row_seconds: float


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def row_frames(case: Case, settings: Settings) -> tuple[int, int]:
    """The frames a row of `case` times, and its batch: at most half of them, whole steps."""
    frames = max(2 * NUM_ENVS, round(settings.frames * case.frame_share))
    batch = min(case.frames_per_batch, max(NUM_ENVS, frames // 2 // NUM_ENVS * NUM_ENVS))
    return frames, batch


def measure_row(case: Case, implementation: str, cudagraph: bool, settings: Settings) -> dict:
    """Frames/s of one row (and its peak GPU memory on CUDA), built and timed from scratch."""
    torch.set_num_threads(1)
    device = settings.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    frames, batch = row_frames(case, settings)
    if implementation == HAND:
        fps = hand_loop(case, device, frames, batch, settings.row_seconds)
    else:
        collector = COLLECTORS[implementation](case, device, cudagraph, batch)
        try:
            fps = time_collector(collector, frames, device, settings.row_seconds)
        finally:
            collector.shutdown()
    result = {"fps": fps}
    if device.type == "cuda":
        result["max_memory_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    return result


def unavailable(implementation: str, cudagraph: bool, device: torch.device) -> str | None:
    """Why a row cannot run here, or None."""
    if cudagraph and device.type != "cuda":
        return NO_CUDA
    if implementation == "torchrl" and importlib.util.find_spec("torchrl") is None:
        return NO_TORCHRL
    return None


def row_timed_out(signum: int, frame: Any) -> None:
    raise TimeoutError(f"the row took over {ROW_TIMEOUT} s")


def attempt(case: Case, implementation: str, cudagraph: bool, settings: Settings) -> dict | str:
    """`measure_row`'s result, or its error as one line: one failing row, or one hung in
    Python code (interrupted after ROW_TIMEOUT seconds), must not end the run."""
    signal.signal(signal.SIGALRM, row_timed_out)
    signal.alarm(ROW_TIMEOUT)
    try:
        return measure_row(case, implementation, cudagraph, settings)
    except Exception as err:
        return " ".join(f"{type(err).__name__}: {err}".split())[:300]
    finally:
        signal.alarm(0)
        gc.collect()
        if settings.device.type == "cuda":
            torch.cuda.empty_cache()


Key = tuple[str, str, str, bool]  # env, policy, implementation, cudagraph


def run_round(
    cases: list[Case], settings: Settings, label: str, outcomes: dict[Key, list[dict | str]]
) -> None:
    """Every row once, its outcome appended to `outcomes` (and printed, when it ran)."""
    for case in cases:
        for implementation, cudagraph in ROWS:
            reason = unavailable(implementation, cudagraph, settings.device)
            outcome = reason or attempt(case, implementation, cudagraph, settings)
            outcomes.setdefault((case.env, case.policy, implementation, cudagraph), []).append(
                outcome
            )
            if reason is None:
                shown = f"{outcome['fps']:,.0f} frames/s" if isinstance(outcome, dict) else outcome
                graph = " cudagraph" if cudagraph else ""
                print(f"{label}: {case.env} | {case.policy} | {implementation}{graph}: {shown}")
                sys.stdout.flush()  # progress shows as it goes, even through a pipe


# --- reporting --------------------------------------------------------------------------------


def summarise(key: Key, outcomes: list[dict | str]) -> dict[str, Any]:
    """One row of the report: best and median frames/s over the rounds, or why there is none."""
    env, policy, implementation, cudagraph = key
    measured = [outcome for outcome in outcomes if isinstance(outcome, dict)]
    row: dict[str, Any] = {
        "env": env,
        "policy": policy,
        "implementation": implementation,
        "cudagraph": cudagraph,
        "fps": max((m["fps"] for m in measured), default=None),
        "fps_median": statistics.median(m["fps"] for m in measured) if measured else None,
        "fps_rounds": [m["fps"] for m in measured],
        "status": "ok" if measured else outcomes[-1],
        "errors": [outcome for outcome in outcomes if not isinstance(outcome, dict)],
    }
    memory = [m["max_memory_mib"] for m in measured if "max_memory_mib" in m]
    row["max_memory_mib"] = max(memory) if memory else None
    return row


def report_rows(outcomes: dict[Key, list[dict | str]]) -> list[dict[str, Any]]:
    rows = [summarise(key, results) for key, results in outcomes.items()]
    add_ratios(rows)
    return rows


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's frames/s over the hand loop's, and over TorchRL's with the same
    `cudagraph_policy` (its eager row for the hand loop)."""
    fps = {(r["env"], r["policy"], r["implementation"], r["cudagraph"]): r["fps"] for r in rows}
    for row in rows:
        case = (row["env"], row["policy"])
        hand = fps.get((*case, HAND, False))
        torchrl = fps.get((*case, "torchrl", row["cudagraph"]))
        row["ratio_hand_loop"] = row["fps"] / hand if row["fps"] and hand else None
        row["ratio_torchrl"] = row["fps"] / torchrl if row["fps"] and torchrl else None


def markdown_table(rows: list[dict[str, Any]], cuda: bool) -> str:
    """The rows as a markdown table (a failed row shows its error in the frames/s column)."""
    head = ["env", "policy", "implementation", "cudagraph", "frames/s", "/ hand loop", "/ TorchRL"]
    head += ["peak GPU MiB"] if cuda else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        if row["fps"] is None:
            status = row["status"]
            value = status if status.startswith("n/a") else f"FAILED: {status}"
        else:
            value = f"{row['fps']:,.0f}"
        cells = [row["env"], row["policy"], row["implementation"]]
        cells += ["yes" if row["cudagraph"] else "no", value.replace("|", "/")]
        cells += [ratio_cell(row["ratio_hand_loop"]), ratio_cell(row["ratio_torchrl"])]
        if cuda:
            memory = row["max_memory_mib"]
            cells.append("-" if memory is None else f"{memory:,.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio_cell(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def machine_facts(device: torch.device) -> dict[str, Any]:
    facts: dict[str, Any] = {"device": device.type, "cpu_count": os.cpu_count()}
    facts["device_name"] = "cpu"
    if device.type == "cuda":
        torch.cuda.init()  # before the first row resets its peak memory statistics
        properties = torch.cuda.get_device_properties(device)
        facts["device_name"] = properties.name
        facts["device_memory_gib"] = round(properties.total_memory / 2**30, 1)
    facts["python"] = sys.version.split()[0]
    for package in ("torch", "tensordict", "torchrl", "gymnasium", "rlcollect", "envpool"):
        try:
            facts[package] = importlib.import_module(package).__version__
        except (ImportError, AttributeError):
            facts[package] = None
    return facts


def write_report(out: Path, report: dict[str, Any], table: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_benchmark.json").write_text(json.dumps(report, indent=2) + "\n")
    facts = ", ".join(f"{k}={v}" for k, v in report.items() if k != "rows")
    (out / "gpu_benchmark.md").write_text(f"# GPU benchmark\n\n{facts}\n\n{table}\n")


# --- main -------------------------------------------------------------------------------------


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    default = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", choices=["cuda", "cpu"], default=default)
    parser.add_argument("--quick", action="store_true", help="tiny frame counts, one round")
    parser.add_argument(
        "--frames", type=int, default=None, help="timed frames per CartPole row (pixels: a fifth)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds")
    parser.add_argument("--row-seconds", type=float, default=4.0, help="cap on a row's timing")
    parser.add_argument("--pixel", choices=["auto", "pong", "frames"], default="auto")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON and table go")
    args = parser.parse_args()
    for name in ("frames", "rounds"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)} must be at least 1.")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here; use --device cpu.")
    return args


def main() -> int:
    started = time.perf_counter()
    args = parse_arguments()
    # The Nature CNN's Categorical checks its logits on the host at every call: a device sync
    # per step, which CUDA-graph capture refuses. Off for every row alike.
    torch.distributions.Distribution.set_default_validate_args(False)
    # TorchRL 0.14 warns at every construction that it will add an InitTracker in 0.15; the
    # policies here are not recurrent, so there is nothing to add.
    warnings.filterwarnings("ignore", message=".*missing transforms required by the policy")
    settings = Settings(
        device=torch.device(args.device),
        frames=args.frames or (400 if args.quick else 20_000),
        rounds=args.rounds or (1 if args.quick else 3),
        row_seconds=args.row_seconds,
    )
    cases = make_cases(args.pixel)
    facts = machine_facts(settings.device)
    facts |= {"frames": settings.frames, "rounds": settings.rounds, "quick": args.quick}
    print(f"{facts}\nframes per CartPole row: {settings.frames}, best of {settings.rounds} rounds")
    outcomes: dict[Key, list[dict | str]] = {}
    for round_index in range(settings.rounds):
        run_round(cases, settings, f"round {round_index + 1}", outcomes)
        # written after every round: a run cut short by its window still leaves its numbers
        rows = report_rows(outcomes)
        table = markdown_table(rows, settings.device.type == "cuda")
        elapsed = round(time.perf_counter() - started, 1)
        report = {**facts, "rounds_done": round_index + 1, "seconds": elapsed, "rows": rows}
        write_report(args.out, report, table)
    print(f"\n{table}\n\ntook {elapsed} s; wrote {args.out}/gpu_benchmark.json and .md")
    tried = [row for row in rows if not str(row["status"]).startswith("n/a")]
    return 0 if any(row["fps"] is not None for row in tried) else 1


if __name__ == "__main__":
    sys.exit(main())

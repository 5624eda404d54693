"""Replay buffer throughput, rlcollect against TorchRL: extend and sample on a full 100k buffer.

Three configurations, each run by both libraries on the same data:

- LazyTensorStorage + RandomSampler
- LazyMemmapStorage + RandomSampler
- LazyTensorStorage + PrioritizedSampler (each sample is followed by ``update_priority``; a third
  row alternates extends and samples, so that priorities given to new items are paid for)

``extend`` writes 1000-frame CartPole-like batches (observation [4] float32, one-hot action [2],
reward, done flags, next observation, trajectory ids) into a full buffer; ``sample`` draws 256
frames. Each measurement alternates the two libraries over several rounds and keeps each one's
best round, which is robust to other load on the machine.

Usage: ``python benchmarks/replay.py`` (about a minute) or ``--quick`` (a smoke run). Where
TorchRL's prebuilt C++ extension does not load with the installed torch, its prioritized row
shows n/a; ``--build-torchrl-extension`` compiles the C++ sources that TorchRL's wheel ships
against the installed torch (a few minutes the first time, cached after), and
``--torchrl-extension PATH`` loads a build made elsewhere.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

import rlcollect.replay as ours
from rlcollect.keys import ACTION, DONE_KEYS, NEXT, OBSERVATION, REWARD, TRAJ_IDS

FRAMES_PER_EXTEND = 1000
SAMPLE_SIZE = 256
ALPHA, BETA = 0.7, 0.5


@dataclass
class Settings:
    """How big the buffers are and how long each measurement runs."""

    capacity: int
    rounds: int
    round_seconds: float


def cartpole_batch(num_frames: int, first_traj: int = 0) -> TensorDict:
    """A batch shaped like CartPole transitions."""
    flags = {key: torch.zeros(num_frames, 1, dtype=torch.bool) for key in DONE_KEYS}
    action = torch.nn.functional.one_hot(torch.randint(2, (num_frames,)), 2)
    batch = TensorDict(
        {
            OBSERVATION: torch.randn(num_frames, 4),
            ACTION: action,
            **flags,
            NEXT: {OBSERVATION: torch.randn(num_frames, 4), REWARD: torch.ones(num_frames, 1)},
        },
        batch_size=[num_frames],
    )
    for key, flag in flags.items():
        batch[NEXT, key] = flag.clone()
    batch[TRAJ_IDS] = first_traj + torch.arange(num_frames) // 200
    return batch


def best_rate(operations: list[Callable[[], Any]], settings: Settings) -> list[float]:
    """Operations per second of each callable: the best of ``rounds`` alternating rounds."""
    best = [0.0] * len(operations)
    for _ in range(settings.rounds):
        for position, operation in enumerate(operations):
            count, start = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - start) < settings.round_seconds:
                operation()
                count += 1
            best[position] = max(best[position], count / elapsed)
    return best


def make_buffers(config: str, library: Any, settings: Settings, scratch: str) -> Any:
    """A replay buffer of ``config`` from ``library`` (rlcollect.replay or torchrl.data)."""
    capacity = settings.capacity
    if config == "memmap+random":
        storage = library.LazyMemmapStorage(capacity, scratch_dir=scratch)
    else:
        storage = library.LazyTensorStorage(capacity)
    if config == "tensor+prioritized":
        sampler = library.PrioritizedSampler(capacity, ALPHA, BETA)
    else:
        sampler = library.RandomSampler()
    return library.ReplayBuffer(storage=storage, sampler=sampler)


def fill(buffer: Any, settings: Settings) -> Callable[[], Any]:
    batch = cartpole_batch(FRAMES_PER_EXTEND)
    for _ in range(settings.capacity // FRAMES_PER_EXTEND + 1):
        buffer.extend(batch)
    return lambda: buffer.extend(batch)


def sampler_step(buffer: Any, prioritized: bool) -> Callable[[], Any]:
    if not prioritized:
        return lambda: buffer.sample(SAMPLE_SIZE)
    priorities = torch.rand(SAMPLE_SIZE)

    def step() -> None:
        _, info = buffer.sample(SAMPLE_SIZE, return_info=True)
        buffer.update_priority(info["index"], priorities)

    return step


def measure(config: str, settings: Settings) -> list[tuple[str, float, float | None, str]]:
    """Rows ``(operation, ours, torchrl or None, note)`` for one configuration."""
    import torchrl.data as theirs

    with tempfile.TemporaryDirectory() as ours_dir, tempfile.TemporaryDirectory() as their_dir:
        buffers = [make_buffers(config, ours, settings, ours_dir)]
        note = ""
        try:
            buffers.append(make_buffers(config, theirs, settings, their_dir))
        except RuntimeError as error:  # TorchRL's C++ extension may not load with this torch
            reason = str(error).splitlines()[0].removesuffix(" See warning above.")
            note = (
                f"TorchRL's C++ extension (torchrl._torchrl) does not load here: {reason}; "
                "rerun with --build-torchrl-extension"
            )
        extends = [fill(buffer, settings) for buffer in buffers]
        extend_rates = best_rate(extends, settings)
        prioritized = config.endswith("prioritized")
        samples = [sampler_step(buffer, prioritized) for buffer in buffers]
        sample_rates = best_rate(samples, settings)
        measured = [
            (f"extend({FRAMES_PER_EXTEND})", extend_rates),
            (
                f"sample({SAMPLE_SIZE})" + (" + update_priority" if prioritized else ""),
                sample_rates,
            ),
        ]
        if prioritized:
            # rlcollect gives new items their priority lazily, at the next sample, so the rows
            # above leave that work out; alternating extends and samples counts it, like training.
            steps = [
                interleaved(extend, sample) for extend, sample in zip(extends, samples, strict=True)
            ]
            measured.append(("extend, then sample + update", best_rate(steps, settings)))
        for buffer in buffers:
            if hasattr(buffer, "close"):
                buffer.close()
    return [
        (name, rates[0], rates[1] if len(rates) > 1 else None, note) for name, rates in measured
    ]


def interleaved(extend: Callable[[], Any], sample: Callable[[], Any]) -> Callable[[], None]:
    """One extend followed by one sampling step."""

    def step() -> None:
        extend()
        sample()

    return step


def print_table(results: list[tuple[str, str, float, float | None, str]]) -> None:
    header = (
        f"{'configuration':<22}{'operation':<34}{'rlcollect/s':>13}{'torchrl/s':>12}{'ratio':>8}"
    )
    print(header)
    print("-" * len(header))
    for config, operation, mine, theirs, note in results:
        their_text = f"{theirs:12.0f}" if theirs else f"{'n/a':>12}"
        ratio_text = f"{mine / theirs:7.2f}x" if theirs else f"{'n/a':>8}"
        print(f"{config:<22}{operation:<34}{mine:13.0f}{their_text}{ratio_text}")
        if note:
            print(f"{'':<22}  ({note})")


def build_torchrl_extension() -> None:
    """Compiles TorchRL's shipped C++ sources (``torchrl/csrc``) against the installed torch, in
    a cache directory per torch version, and makes ``import torchrl._torchrl`` load the result."""
    from torch.utils.cpp_extension import load

    spec = importlib.util.find_spec("torchrl")
    if spec is None or spec.origin is None:
        raise SystemExit("TorchRL is not installed; nothing to build.")
    sources = Path(spec.origin).parent / "csrc"
    build = Path(tempfile.gettempdir()) / f"rlcollect-torchrl-extension-{torch.__version__}"
    build.mkdir(exist_ok=True)
    print(f"compiling TorchRL's C++ extension from {sources} in {build} (once) ...", flush=True)
    module = load(
        "_torchrl",
        [str(sources / "pybind.cpp"), str(sources / "utils.cpp")],
        extra_cflags=["-O3"],
        build_directory=str(build),
    )
    sys.modules["torchrl._torchrl"] = module


def load_torchrl_extension(path: str) -> None:
    """Makes ``import torchrl._torchrl`` load the extension built at ``path``."""
    spec = importlib.util.spec_from_file_location("torchrl._torchrl", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load a Python extension from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["torchrl._torchrl"] = module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument(
        "--torchrl-extension",
        metavar="PATH",
        help="a build of TorchRL's C++ extension (_torchrl.so) to use where the installed one "
        "does not load with this torch (TorchRL's PrioritizedSampler needs it)",
    )
    parser.add_argument(
        "--build-torchrl-extension",
        action="store_true",
        help="compile TorchRL's C++ extension from the sources its wheel ships, against the "
        "installed torch (needs a C++ compiler; cached per torch version)",
    )
    args = parser.parse_args()
    if args.torchrl_extension:
        load_torchrl_extension(args.torchrl_extension)
    elif args.build_torchrl_extension:
        build_torchrl_extension()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    warnings.filterwarnings("ignore")
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    if args.quick:
        settings = Settings(capacity=10_000, rounds=1, round_seconds=0.05)
    else:
        settings = Settings(capacity=100_000, rounds=5, round_seconds=1.0)
    results = []
    for config in ("tensor+random", "memmap+random", "tensor+prioritized"):
        for operation, mine, theirs, note in measure(config, settings):
            results.append((config, operation, mine, theirs, note))
    print(
        f"replay buffers of {settings.capacity} frames, {FRAMES_PER_EXTEND}-frame extends, "
        f"{SAMPLE_SIZE}-frame samples, 1 thread (ops/s, best of {settings.rounds} rounds)"
    )
    print_table(results)


if __name__ == "__main__":
    main()

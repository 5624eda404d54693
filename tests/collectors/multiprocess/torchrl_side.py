"""TorchRL's multi-process collectors, run in a Python process of their own for side-by-side
tests: what they leave behind (the semaphores of their queues) is then not charged to ours by
the leak checks of `tests/conftest.py`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]

# TorchRL's workers forked (its default is spawn): the same answer, a fraction of the start-up.
SCRIPT = """
import json, multiprocessing, os, sys
import torchrl.collectors as collectors
from tests.collectors.multiprocess.torchrl_side import describe, torchrl_cartpole

if __name__ == "__main__":
    multiprocessing.set_start_method("fork", force=True)
    request = json.loads(sys.argv[1])
    makers = request.pop("makers")
    create_env_fn = [torchrl_cartpole] * makers if makers else torchrl_cartpole
    collector = getattr(collectors, request.pop("builder"))(create_env_fn, **request)
    try:
        print(json.dumps(describe(collector, collectors.MultiCollector)), flush=True)
    finally:
        collector.shutdown()
    # Its workers are gone by now, but with them forked TorchRL's exit hangs: end here.
    os._exit(0)
"""


def torchrl_cartpole() -> Any:
    """TorchRL's CartPole (importable by worker processes)."""
    from torchrl.envs import GymEnv

    return GymEnv("CartPole-v1")


def leaf_keys(batch: Any) -> list[str]:
    return sorted(str(key) for key in batch.keys(include_nested=True, leaves_only=True))


def describe(collector: Any, multi_collector_class: type) -> dict[str, Any]:
    """What the side-by-side tests compare: the class, its workers, their frames, and the
    shape and keys of the first batch."""
    workers = getattr(collector, "num_workers", None)
    per_worker = None
    if hasattr(collector, "frames_per_batch_worker"):
        per_worker = [collector.frames_per_batch_worker(worker_idx=i) for i in (None, 0)]
    batch = next(iter(collector))
    return {
        "class": type(collector).__name__,
        "is_multi_collector": isinstance(collector, multi_collector_class),
        "num_workers": workers,
        "frames_per_batch_worker": per_worker,
        "batch_size": list(batch.batch_size),
        "keys": leaf_keys(batch),
    }


def run_torchrl(builder: str, makers: int = 0, **arguments: Any) -> dict[str, Any]:
    """`describe()` of TorchRL's `builder(torchrl_cartpole or [it] * makers, **arguments)`,
    built and shut down in a fresh Python process."""
    request = json.dumps({"builder": builder, "makers": makers, **arguments})
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, request],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"TorchRL's {builder} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))

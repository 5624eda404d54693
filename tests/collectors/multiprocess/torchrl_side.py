"""TorchRL's multi-process collectors, run in a Python process of their own for side-by-side
tests: what they leave behind (the semaphores of their queues) is then not charged to ours by
the leak checks of `tests/conftest.py`. The process is a child of the script zygote
(tests/examples/script_runner.py: torch imported once), running this file as a script; TorchRL's
workers are forked (its default is spawn): the same answer, a fraction of the start-up."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]


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


def run_side(request: dict[str, Any], task: str, timeout: float) -> Any:
    """Run this file as a script on `request` (`task`: "describe" or "fill") in a child of the
    script zygote; the JSON of its last line of output. A failure is raised with its errors."""
    from tests.examples.script_runner import zygote

    argv = [__file__, task, json.dumps(request)]
    done = zygote().run(argv, dict(os.environ), timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"TorchRL's collectors failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_torchrl(builder: str, makers: int = 0, **arguments: Any) -> dict[str, Any]:
    """`describe()` of TorchRL's `builder(torchrl_cartpole or [it] * makers, **arguments)`,
    built and shut down in a Python process of its own."""
    request = {"builder": builder, "makers": makers, **arguments}
    return dict(run_side(request, "describe", timeout=150))


def describe_torchrl(request: dict[str, Any]) -> None:
    """In the side process: build TorchRL's collector, print its description."""
    import torchrl.collectors as collectors

    makers = request.pop("makers")
    create_env_fn = [torchrl_cartpole] * makers if makers else torchrl_cartpole
    collector = getattr(collectors, request.pop("builder"))(create_env_fn, **request)
    try:
        sys.stdout.write(json.dumps(describe(collector, collectors.MultiCollector)) + "\n")
    finally:
        collector.shutdown()


def main(task: str, request: dict[str, Any]) -> None:
    """The side process: TorchRL's workers forked; `task` done; the process ended at once
    (TorchRL's workers are gone by then, but with them forked its exit hangs)."""
    multiprocessing.set_start_method("fork", force=True)
    if task == "fill":
        from tests.collectors.multiprocess.torchrl_buffer_side import fill_all

        fill_all(request)
    else:
        describe_torchrl(request)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # run as a script: the repository's packages importable
    main(sys.argv[1], json.loads(sys.argv[2]))

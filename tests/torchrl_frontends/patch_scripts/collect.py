"""A plain TorchRL script (it imports nothing of rlcollect) that builds a `Collector` and a
`MultiSyncCollector`, collects two batches with each and shuts them down; tests run it under
`python -m rlcollect.patch`.

Every process it involves writes what `torchrl.collectors`' names resolve to there, into the
folder `$PATCH_TEST_RECORDS`: this process, the multi-process collector's workers (when they
build their env) and one child per start method named on the command line (the first is made
the default, TorchRL's way to choose one).

    python -m rlcollect.patch collect.py [--no-multi] spawn [fork forkserver ...]
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from pathlib import Path

import torch
from torchrl.collectors import Collector, MultiSyncCollector, RandomPolicy
from torchrl.envs import GymEnv, StepCounter, TransformedEnv

NAMES = ("Collector", "MultiSyncCollector", "MultiAsyncCollector", "SyncDataCollector")


def record(role: str) -> None:
    """Write, for this process, the module each of TorchRL's collector names resolves to."""
    import torchrl.collectors

    found = {name: getattr(torchrl.collectors, name, None) for name in NAMES}
    line = {name: getattr(cls, "__module__", None) for name, cls in found.items()}
    line |= {"role": role, "pid": os.getpid()}
    path = Path(os.environ["PATCH_TEST_RECORDS"]) / f"{role}-{os.getpid()}.json"
    path.write_text(json.dumps(line))


def make_env() -> TransformedEnv:
    record("env")
    return TransformedEnv(GymEnv("Pendulum-v1"), StepCounter(20))


def main(start_methods: list[str], multi: bool) -> None:
    multiprocessing.set_start_method(start_methods[0], force=True)
    record("main")
    torch.manual_seed(0)
    policy = RandomPolicy(make_env().action_spec)
    # --- one process ---
    collector = Collector(make_env, policy, frames_per_batch=20, total_frames=40)
    batches = [batch.numel() for batch in collector]
    collector.shutdown()
    # --- worker processes ---
    if multi:
        collector = MultiSyncCollector(
            [make_env, make_env], policy, frames_per_batch=40, total_frames=80
        )
        batches += [batch.numel() for batch in collector]
        collector.shutdown()
    # --- a child per start method ---
    for method in start_methods:
        child = multiprocessing.get_context(method).Process(
            target=record, args=(f"child-{method}",)
        )
        child.start()
        child.join(120)
    print(json.dumps({"built": type(collector).__module__, "batches": batches}))  # noqa: T201


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(
        [a for a in arguments if not a.startswith("--")] or ["spawn"], "--no-multi" not in arguments
    )

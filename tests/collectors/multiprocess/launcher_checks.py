"""TorchRL's launchers run in a process of their own; checks that updates reached the workers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GRACE_SECONDS, processes_gone, shared_memory_entries, shared_memory_left

pytest.importorskip("torch.distributed")

ROOT = Path(__file__).resolve().parents[3]
# A launcher run starts a process group, node processes and their workers: a minute or two
# on a busy 2-core machine; this bounds a hang.
RUN_TIMEOUT = 240

Case = tuple[str, str, str, bool]  # launcher, owner, node collector class, pfactory


def launcher_runs(cases: list[Case]) -> dict[Case, dict[str, Any]]:
    """Run TorchRL's launchers, one case after the other in one process (see
    torchrl_launcher_runs.py: the cases share its start, each has a process group of its
    own); check that every process it started is gone, and every /dev/shm entry it made.
    Each case's result, which holds `error` (a traceback) where the case raised and `left`,
    the processes it started that outlived it."""
    command = [sys.executable, "-m", "tests.collectors.torchrl_launcher_runs"]
    for launcher, owner, name, pfactory in cases:
        command += [launcher, owner, name, str(int(pfactory)), "0"]
    shared_before = shared_memory_entries()
    done = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT * len(cases),
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    output = done.stdout[-3000:] + done.stderr[-6000:]
    assert done.returncode == 0, output
    assert len(lines) == len(cases), output
    results = [json.loads(line) for line in lines]
    started = sorted({pid for result in results for pid in result["started"]})
    assert processes_gone(started, within=30.0), "the launcher left processes behind"
    # What the tests' no_leftover_children checks, for runs made by a module fixture, too.
    leaked = shared_memory_left(shared_before, time.monotonic() + GRACE_SECONDS)
    assert not leaked, f"the launcher left shared memory behind in /dev/shm: {sorted(leaked)}"
    return dict(zip(cases, results, strict=True))


def case_result(results: dict[Case, dict[str, Any]], case: Case) -> dict[str, Any]:
    """`case`'s result from `launcher_runs`, checked to have run through and left no process
    behind."""
    result = results[case]
    assert "error" not in result, f"{case}: {result.get('error')}"
    assert result["left"] == [], f"{case}: the run left processes behind: {result['left']}"
    return result


def launcher_run(launcher: str, owner: str, name: str, pfactory: bool) -> dict[str, Any]:
    """Run TorchRL's `launcher` with `owner`'s `name` as node collector, in a process of its
    own (see `launcher_runs`)."""
    case = (launcher, owner, name, pfactory)
    return case_result(launcher_runs([case]), case)


def batches_in_flight(launcher: str, name: str, nodes: int) -> int:
    """How many batches started before the update may still arrive after it (asynchronous
    launchers, `sync=False`): TorchRL's `DistributedCollector` has every node collecting but
    the one that delivered batch 0, which waits for the trainer; its `RPCCollector` asks a
    node for its next batch before it yields one, so every node is collecting; a
    `MultiAsyncCollector` node's worker is collecting its next batch too."""
    started = nodes - 1 if launcher == "distributed" else nodes
    return started + (name == "MultiAsyncCollector")


def assert_weights_reached_the_workers(result: dict[str, Any], launcher: str, name: str) -> None:
    """Batch 0 ran the first weights (action 1); every later batch the updated ones (action
    2), but those in flight at the update (`batches_in_flight`), which may arrive at any
    place, the last included. Each ran the old weights, or, on a single `Collector` node,
    both: TorchRL's scheme writes received weights into the node's `policy` from a thread of
    its own, mid-batch. A node whose workers never took the update would bring more batches
    on the old weights."""
    actions = result["actions"]
    assert result["frames"] == 300
    assert actions[0] == [1.0], actions
    assert all(set(action) <= {1.0, 2.0} for action in actions), actions
    late = sum(action != [2.0] for action in actions[1:])
    assert late <= batches_in_flight(launcher, name, result["nodes"]), actions

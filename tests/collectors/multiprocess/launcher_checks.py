"""TorchRL's launchers run in a process of their own; checks that updates reached the workers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import processes_gone

pytest.importorskip("torch.distributed")

ROOT = Path(__file__).resolve().parents[3]
# A launcher run starts a process group, node processes and their workers: a minute or two
# on a busy 2-core machine; this bounds a hang.
RUN_TIMEOUT = 240


def launcher_run(launcher: str, owner: str, name: str, pfactory: bool) -> dict[str, Any]:
    """Run TorchRL's `launcher` with `owner`'s `name` as node collector (see
    torchrl_launcher_runs.py); check that every process it started is gone."""
    command = [sys.executable, "-m", "tests.collectors.torchrl_launcher_runs"]
    command += [launcher, owner, name, str(int(pfactory)), "0"]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    output = done.stdout[-3000:] + done.stderr[-6000:]
    assert done.returncode == 0, output
    assert lines, output
    result: dict[str, Any] = json.loads(lines[-1])
    assert processes_gone(result["started"], within=30.0), "the launcher left processes behind"
    return result


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

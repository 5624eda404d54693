"""TorchRL's torch.distributed launchers run with a node collector class, ours or TorchRL's.

`python -m tests.collectors.torchrl_launcher_runs <launcher> <owner> <class> <pfactory> <sync>
[<launcher> ...]` runs, for each case of five arguments in turn, TorchRL's
`DistributedCollector` or `RPCCollector` (`launcher="mp"`: node processes on this machine, a
gloo group on localhost) over TorchRL's counting env, with `collector_class` the named class of
rlcollect or of TorchRL as the node collector. The policy writes its one weight as the action;
after the first batch the weight goes from 1 to 2 and is sent with `update_policy_weights_`.
It prints one JSON line a case: the actions of each batch, the frames, the number of nodes, the
pids of the processes the case started (every descendant seen while it ran) and those of them
still alive 30 s after it ended, or the traceback of what it raised. A process of its own
because the launcher makes its process rank 0 of a process group (TorchRL's tests run it in a
process of its own too); the cases share it (its start costs seconds of CPU), each in a
process group of its own.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import traceback
from typing import Any

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModuleBase
from torch import nn

from tests.conftest import MULTIPROCESSING_HELPERS, descendants, processes_gone
from tests.start_method import fork_server_by_default

FRAMES_PER_BATCH = 50
TOTAL_FRAMES = 300


class CountingPolicy(TensorDictModuleBase):
    """Writes its weight (1 at first) as every env's action."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor(1.0))
        self.in_keys: list[str] = []
        self.out_keys = ["action"]

    def forward(self, tensordict: Any) -> Any:
        tensordict.set("action", self.weight.expand(tensordict.shape).clone())
        return tensordict


def free_port() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("localhost", 0))
        return str(probe.getsockname()[1])


def collector_class(owner: str, name: str) -> type:
    if owner == "rlcollect":
        import rlcollect.collectors as module
    else:
        import torchrl.collectors as module  # type: ignore[no-redef]
    return getattr(module, name)  # type: ignore[no-any-return]


class Descendants:
    """Every descendant of this process seen while it runs (polled in the background)."""

    def __init__(self) -> None:
        self.pids: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            self.pids.update(descendants())

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join()
        self.pids.update(descendants())
        return sorted(self.pids)


def run(launcher: str, owner: str, name: str, pfactory: bool, sync: bool) -> dict[str, Any]:
    """Collect `TOTAL_FRAMES` through the launcher; the weights change after batch 0."""
    from torchrl.collectors.distributed import DistributedCollector, RPCCollector
    from torchrl.testing.mocking_classes import CountingEnv

    launcher_class = {"distributed": DistributedCollector, "rpc": RPCCollector}[launcher]
    policy = None if pfactory else CountingPolicy()
    weights = TensorDict.from_module(CountingPolicy()).lock_() if pfactory else None
    # As TorchRL's tests: one node for an async node collector, so that no batch of a node
    # still on the old weights arrives after the update.
    nodes = 1 if name == "MultiAsyncCollector" else 2
    collector = launcher_class(
        [CountingEnv] * nodes,
        policy,
        policy_factory=CountingPolicy if pfactory else None,
        collector_class=collector_class(owner, name),
        total_frames=TOTAL_FRAMES,
        frames_per_batch=FRAMES_PER_BATCH,
        sync=sync,
        launcher="mp",
        tcp_port=free_port(),
    )
    actions, frames = [], 0
    try:
        for index, data in enumerate(collector):
            frames += data.numel()
            actions.append(sorted(set(data["action"].flatten().tolist())))
            if index == 0:
                with torch.no_grad():
                    if policy is not None:
                        policy.weight.add_(1)
                    else:
                        weights.data.add_(1)  # type: ignore[union-attr]
                collector.update_policy_weights_(weights)
    finally:
        collector.shutdown()
    return {"actions": actions, "frames": frames, "nodes": nodes}


def own_helpers(pids: set[int]) -> set[int]:
    """The processes of `pids` that this process keeps for its whole life, whichever run
    started them: multiprocessing's resource tracker and fork server (the first start starts
    them)."""
    return {
        pid
        for pid, (ppid, command) in descendants().items()
        if pid in pids
        and ppid == os.getpid()
        and any(helper in command for helper in MULTIPROCESSING_HELPERS)
    }


def run_case(case: list[str], kept: set[int]) -> dict[str, Any]:
    """One run; `case` is `launcher owner class pfactory sync`. Reports the processes it
    started and those of them still alive 30 s after it ended (`left`), but `kept`."""
    launcher, owner, name, pfactory, sync = case
    watch = Descendants()
    result: dict[str, Any] = {"case": " ".join(case)}
    try:
        result.update(run(launcher, owner, name, pfactory == "1", sync == "1"))
    except Exception:  # reported with the case's result; the next case still runs
        result["error"] = traceback.format_exc()
    finally:
        started = watch.stop()
        # The next run makes this process rank 0 of a new group (as the launcher's would).
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    kept |= own_helpers(set(started))
    ended = [pid for pid in started if pid not in kept]
    result["started"] = started
    result["left"] = [] if processes_gone(ended, within=30.0) else ended
    return result


def main() -> None:
    """Run each case of the command line (five arguments each) in turn, one JSON line each:
    several cases share this process's start (imports), each in a process group of its own."""
    arguments = sys.argv[1:]
    if not arguments or len(arguments) % 5:
        raise SystemExit(f"expected cases of 5 arguments each, got {arguments!r}")
    os.environ.setdefault("RCP_IDLE_TIMEOUT", "10")  # TorchRL's RPC nodes' idle bound
    fork_server_by_default()  # node processes forked with torch imported (tests/start_method.py)
    kept: set[int] = set()
    for start in range(0, len(arguments), 5):
        result = run_case(arguments[start : start + 5], kept)
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()

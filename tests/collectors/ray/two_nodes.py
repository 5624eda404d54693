"""RayCollectors on a two-node Ray cluster (`ray.cluster_utils.Cluster`, both nodes on this
machine) that lose the node of one of their actors mid-collection; run by
test_ray_two_nodes.py in a process of its own, since a driver joins one cluster at a time.

Two collectors run at once, each with actor 0 and its replay buffer on the head node and
actor 1 on the worker node, which is removed while the actors fill the buffers in the
background. Without restarts, the collector must name actor 1; with
`restart_dead_collectors=True`, actor 1 must come back on the head node and go on writing.
Either way the buffer, on the surviving node, must keep every write it acknowledged. The facts
go to stdout as one JSON line for the test to check. The nodes' workers are forked from a
preloaded zygote of this process's own (tests/ray_zygote.py), as the test run's cluster's are.

Usage: RAY_TMPDIR=<a short new directory> python -m tests.collectors.ray.two_nodes
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlcollect import keys
from rlcollect.collectors import ActorError, RayCollector
from rlcollect.collectors.children import RESTART_ID_GAP
from rlcollect.replay import LazyTensorStorage, RayReplayBuffer
from tests.collectors.ray.helpers import counting_env
from tests.conftest import descendants
from tests.ray_session import python_through_launcher, worker_zygote

EPISODE = 5
# Frames each actor writes before the worker node is removed, and the restarted one after.
BEFORE_REMOVAL = 200
AFTER_RESTART = 200
# The most they may write (the buffer's capacity: nothing is overwritten).
TOTAL_FRAMES = 1_000_000
NODE = {"object_store_memory": 80 * 1024**2}
# The GCS declares a node dead after 3 missed health checks 0.3 s apart (Ray's default: 5
# missed, 3 s apart), so that the lost actor is known dead within a second or two.
SYSTEM_CONFIG = {
    "health_check_period_ms": 300,
    "health_check_failure_threshold": 3,
    "worker_niceness": 0,  # as the test run's cluster (tests/ray_session.py)
}


def on_node(node_id: str, soft: bool = False) -> dict[str, Any]:
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=soft)}


def wait_for(condition: Any, within: float, what: str) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"waited {within} s for {what}")


def actor_frames(collector: RayCollector) -> list[int]:
    """The frames each actor's collector has collected (since it was built)."""
    return [actor["frames"] for actor in collector.stats()["collectors"]]


def rows(rb: RayReplayBuffer, count: int) -> Any:
    return rb[torch.arange(count)].select(keys.TRAJ_IDS, ("next", "observation"))


def contiguous_trajectories(data: Any) -> bool:
    """Whether every trajectory's counts run 1, 2, ... (in the order written), none doubled."""
    ids = data[keys.TRAJ_IDS].flatten()
    counts = data["next", "observation"].flatten()
    for traj in ids.unique().tolist():
        own = counts[ids == traj]
        if not torch.equal(own, torch.arange(1, own.numel() + 1, dtype=own.dtype)):
            return False
    return True


@dataclass
class Case:
    """One collector and its buffer, and the facts gathered about them."""

    collector: RayCollector
    rb: RayReplayBuffer
    facts: dict[str, Any]
    before: Any = None  # the buffer's rows before the removal


def build_case(head_id: str, worker_id: str, restart: bool) -> Case:
    """Actor 0 and the buffer on the head node, actor 1 on the worker node."""
    rb = RayReplayBuffer(storage=LazyTensorStorage(TOTAL_FRAMES), remote_config=on_node(head_id))
    collector = RayCollector(
        counting_env(EPISODE),
        num_collectors=2,
        frames_per_batch=20,
        total_frames=TOTAL_FRAMES,
        replay_buffer=rb,
        # Soft affinity: a restarted actor may go to another node once its own is gone.
        remote_configs=[on_node(head_id), on_node(worker_id, soft=True)],
        restart_dead_collectors=restart,
    )
    facts: dict[str, Any] = {"head": head_id, "worker": worker_id}
    facts["placed"] = [actor["node_id"] for actor in collector.stats()["collectors"]]
    facts["buffer_node"] = ray.get(
        ray.get_actor(rb.name).__ray_call__.remote(
            lambda _: ray.get_runtime_context().get_node_id()
        )
    )
    facts["pids"] = collector.process_ids()
    return Case(collector, rb, facts)


def hold_acknowledged(case: Case) -> None:
    """Once the actors wrote a few batches in the background: what the buffer acknowledged
    so far."""
    wait_for(lambda: min(actor_frames(case.collector)) >= BEFORE_REMOVAL, 60, "first frames")
    case.facts["counted_before"] = case.collector.frames
    case.facts["held_before"] = case.rb.write_count
    case.before = rows(case.rb, case.facts["held_before"])


def see_it_fail(case: Case) -> None:
    try:
        wait_for(lambda: case.collector.frames < 0, 60, "the failure")
    except ActorError as err:
        case.facts["error"] = {"index": err.worker, "message": str(err)}


def see_it_restart(case: Case) -> None:
    collector = case.collector
    try:
        wait_for(lambda: collector.stats()["collectors"][1]["restarts"], 60, "a restart")
        # The restarted process's own frames (its collector counts from 0).
        wait_for(lambda: actor_frames(collector)[1] >= AFTER_RESTART, 60, "frames after it")
        collector.async_shutdown()
    except ActorError as err:
        case.facts["error"] = {"index": err.worker, "message": str(err)}
        return
    case.facts["actors_after"] = [
        {"node": actor["node_id"], "restarts": actor["restarts"], "pid": actor["pid"]}
        for actor in collector.stats()["collectors"]
    ]


def finish(case: Case) -> dict[str, Any]:
    """Shut the collector down and read the buffer: what it kept, counted and holds."""
    facts, rb = case.facts, case.rb
    facts["frames"] = case.collector.frames
    case.collector.shutdown()
    facts["write_count"] = rb.write_count
    facts["kept"] = bool((rows(rb, facts["held_before"]) == case.before).all())
    everything = rows(rb, min(rb.write_count, len(rb)))
    facts["contiguous"] = contiguous_trajectories(everything)
    ids = everything[keys.TRAJ_IDS].flatten()
    facts["written_by_actor"] = [int((ids % 2 == index).sum()) for index in (0, 1)]
    facts["restart_ids"] = int((ids >= RESTART_ID_GAP).sum())
    rb.close()
    return facts


def start_cluster(launcher_dir: Path) -> tuple[Cluster, Any]:
    """The head node and the worker node, their workers forked from the zygote that serves in
    `launcher_dir` (as the test run's cluster's: tests/ray_session.py)."""
    with python_through_launcher(launcher_dir):
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                **NODE,
                "num_cpus": 3,
                "include_dashboard": False,
                "_system_config": SYSTEM_CONFIG,
            },
        )
        try:
            return cluster, cluster.add_node(**NODE, num_cpus=2)
        except BaseException:
            cluster.shutdown()
            raise


def run() -> dict[str, Any]:
    """Two collectors at once, one that reports a lost actor and one that restarts it, on a
    head node and a worker node; the worker node is removed while both write."""
    facts: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        # In RAY_TMPDIR (short, removed by the test): the launcher and the zygote's socket.
        launcher_dir = Path(tempfile.mkdtemp(dir=os.environ.get("RAY_TMPDIR")))
        stack.enter_context(worker_zygote(str(launcher_dir / "socket")))
        cluster, worker = start_cluster(launcher_dir)
        stack.callback(cluster.shutdown)
        stack.callback(ray.shutdown)
        ray.init(address=cluster.address, log_to_driver=False)
        head_id, worker_id = cluster.head_node.node_id, worker.node_id
        started = time.monotonic()
        report = build_case(head_id, worker_id, restart=False)
        restart = build_case(head_id, worker_id, restart=True)
        facts["seconds_to_build"] = time.monotonic() - started
        for case in (report, restart):
            case.collector.start()
        for case in (report, restart):
            hold_acknowledged(case)
        cluster.remove_node(worker)
        removed = time.monotonic()
        see_it_fail(report)
        see_it_restart(restart)
        facts["seconds_after_removal"] = time.monotonic() - removed
        facts["report"], facts["restart"] = finish(report), finish(restart)
        facts["pids"] = sorted(descendants())  # the nodes' processes, the actors' too
    facts["left"] = sorted(descendants())
    return facts


if __name__ == "__main__":
    sys.stdout.write(json.dumps(run()) + "\n")

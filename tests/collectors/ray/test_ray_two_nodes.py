"""A RayCollector on two Ray nodes (`ray.cluster_utils.Cluster` on this machine) that loses
the node of one actor mid-collection: the actor is named, or restarted on the surviving node,
and the replay buffer served from the surviving node keeps every acknowledged write.

The cluster runs in a process of its own (two_nodes.py): this process is joined to the
session's cluster, and a driver joins one cluster at a time. Its Ray files live in a directory
of their own (RAY_TMPDIR), so that no other `ray.init()` on the machine finds this cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import held_elsewhere, processes_gone, shared_memory_entries

pytest.importorskip("ray")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(400),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]
ROOT = Path(__file__).resolve().parents[3]
SCRIPT_SECONDS = 300


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line holds `text` (the raylets and GCS of a cluster name
    its directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def run_two_nodes() -> dict[str, Any]:
    """Run two_nodes.py (both cases, one cluster); its facts, with what was left behind:
    processes of the cluster and new /dev/shm entries."""
    ray_dir = tempfile.mkdtemp(prefix="rlc2n-", dir="/tmp")  # short: Ray's sockets live there
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = ray_dir
    shm_before = shared_memory_entries()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.collectors.ray.two_nodes"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # on a timeout, its whole group goes
    )
    try:
        out, err = process.communicate(timeout=SCRIPT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    finally:
        left = processes_mentioning(ray_dir)
        shutil.rmtree(ray_dir, ignore_errors=True)
    assert process.returncode == 0, err[-4000:]
    facts: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    facts["cluster_processes_left"] = left
    new = shared_memory_entries() - shm_before
    facts["shm_new"] = sorted(new - held_elsewhere(new))
    return facts


def check_placement(facts: dict[str, Any], case: str) -> None:
    assert facts["head"] != facts["worker"]
    assert facts["placed"] == [facts["head"], facts["worker"]], f"{case}: actors 0 and 1"
    assert facts["buffer_node"] == facts["head"], f"{case}: the buffer"
    assert all(facts["written_by_actor"]), f"{case}: both actors wrote"


def check_the_report(facts: dict[str, Any]) -> None:
    assert facts["error"]["index"] == 1
    message = facts["error"]["message"]
    assert message.startswith("collector actor 1 failed: the actor died"), message
    assert f"its node has died. Node Id: {facts['worker']}" in message


def check_the_restart(facts: dict[str, Any]) -> None:
    assert "error" not in facts, facts.get("error")
    after = facts["actors_after"]
    assert [actor["node"] for actor in after] == [facts["head"], facts["head"]]
    assert [actor["restarts"] for actor in after] == [0, 1]
    assert after[0]["pid"] == facts["pids"][0], "actor 0 kept running"
    assert facts["restart_ids"] > 0, "the restarted actor wrote, with trajectory ids of its own"
    assert facts["frames"] >= facts["counted_before"] + 200, "collection went on"
    # 200 frames each before and after (one batch may go down with the node).
    assert facts["written_by_actor"][1] >= 300, "actor 1 wrote before and after the restart"


def check_the_buffer(facts: dict[str, Any], case: str) -> None:
    assert facts["kept"], f"{case}: the rows written before the removal are unchanged"
    assert facts["counted_before"] <= facts["held_before"] <= facts["write_count"]
    assert facts["frames"] == facts["write_count"], f"{case}: frames is what the buffer got"
    assert facts["contiguous"], f"{case}: every trajectory runs 1, 2, ..., none lost or doubled"


def check_nothing_left(facts: dict[str, Any]) -> None:
    assert facts["left"] == [], "the script's own processes all ended"
    assert facts["cluster_processes_left"] == []
    pids = facts["pids"] + [actor["pid"] for actor in facts["restart"]["actors_after"]]
    assert processes_gone(pids, 15), "the nodes' processes and the actors ended"
    assert facts["shm_new"] == []


def test_a_lost_node_is_reported_or_its_actor_restarted_and_the_buffer_keeps_every_write() -> None:
    """Actors on both nodes, the buffer on the head; the worker node removed mid-collection,
    once without restarts (actor 1 is named) and once with them (actor 1 comes back on the
    head node and collection goes on)."""
    facts = run_two_nodes()
    for case in ("report", "restart"):
        check_placement(facts[case], case)
        check_the_buffer(facts[case], case)
    check_the_report(facts["report"])
    check_the_restart(facts["restart"])
    check_nothing_left(facts)

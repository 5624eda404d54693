"""Workers of workers are forked by the fork server their parent came from: a nested
collector starts one server, not one more per worker that has workers."""

from __future__ import annotations

import functools
import multiprocessing.forkserver
import os
import sys
from pathlib import Path

import pytest
import torch.distributed

from rlcollect import MultiSyncCollector
from rlcollect.runtime.fork_server import SHARED_BELOW, share_parent_fork_server
from rlcollect.testing import CountingEnv
from tests.conftest import process_parents

pytestmark = pytest.mark.usefixtures("no_leftover_children")


@pytest.mark.skipif(sys.version_info >= SHARED_BELOW, reason="Python 3.14 keeps one per worker")
@pytest.mark.timeout(120)
def test_a_nested_collectors_workers_all_come_from_one_fork_server() -> None:
    inner = functools.partial(MultiSyncCollector, num_workers=2)
    with MultiSyncCollector(
        functools.partial(CountingEnv, episode_length=4),
        num_workers=2,
        frames_per_batch=16,
        total_frames=32,
        collector_class=inner,
        mp_start_method="forkserver",
    ) as collector:
        batches = list(collector)
        pids = collector.process_ids()
        parents = process_parents()
        servers = {parents[pid] for pid in pids}
    assert len(batches) == 2
    assert len(pids) == 6, "2 workers and their 2 workers each"
    assert len(servers) == 1, f"the workers' parents: {servers} (a fork server per nested worker)"
    assert parents[servers.pop()] == os.getpid(), "the server is the one this process started"


def report_node_worker_parents(rendezvous: str, reports: multiprocessing.SimpleQueue) -> None:
    """In a process of a torch.distributed group (a launcher's node): build a multi-process
    collector, collect, and report this process's parent and its workers' parents."""
    torch.distributed.init_process_group("gloo", init_method=rendezvous, rank=0, world_size=1)
    try:
        with MultiSyncCollector(
            functools.partial(CountingEnv, episode_length=4),
            num_workers=2,
            frames_per_batch=8,
            total_frames=8,
        ) as collector:
            batches = len(list(collector))
            parents = process_parents()
            workers = [parents[pid] for pid in collector.process_ids()]
        reports.put((os.getppid(), workers, batches))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.skipif(sys.version_info >= SHARED_BELOW, reason="Python 3.14 keeps one per worker")
@pytest.mark.timeout(120)
def test_a_launcher_node_a_fork_server_forked_has_its_workers_forked_by_that_server(
    tmp_path: Path,
) -> None:
    """A node of a distributed launcher does not wait for its workers, and would otherwise
    spawn them (a fresh interpreter each) rather than start a fork server of its own."""
    context = multiprocessing.get_context("forkserver")
    reports = context.SimpleQueue()
    rendezvous = f"file://{tmp_path / 'rendezvous'}"
    node = context.Process(target=report_node_worker_parents, args=(rendezvous, reports))
    node.start()
    try:
        server, workers, batches = reports.get()
    finally:
        node.join(60)
    assert node.exitcode == 0
    assert batches == 1
    assert workers == [server, server], f"node {node.pid}, its server {server}: {workers}"


def test_a_process_no_fork_server_forked_keeps_pythons_own_start() -> None:
    server = multiprocessing.forkserver._forkserver
    share_parent_fork_server()
    assert "ensure_running" not in vars(server), "this process starts its own server"

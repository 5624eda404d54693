"""Workers of workers are forked by the fork server their parent came from: a nested
collector starts one server, not one more per worker that has workers."""

from __future__ import annotations

import functools
import multiprocessing.forkserver
import os
import sys

import pytest

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


def test_a_process_no_fork_server_forked_keeps_pythons_own_start() -> None:
    server = multiprocessing.forkserver._forkserver
    share_parent_fork_server()
    assert "ensure_running" not in vars(server), "this process starts its own server"

"""Weight updates sent from another thread while the multi-process collectors collect.

TorchRL's `RPCCollector` does this to the collector on each of its nodes: one RPC thread waits
on `next()` while another delivers `update_policy_weights_` (its scheme's receive). The
workers' pipes are shared by both, so the collector must take turns on them: before, the two
threads polled one pipe at once (`concurrent poll() invocation`) and the collector shut down.
"""

from __future__ import annotations

import threading

import pytest
import torch

from rlcollect.collectors import MultiAsyncCollector, MultiSyncCollector
from tests.collectors.multiprocess.recording_factory import pendulum, policy_with_bias

UPDATES = 20


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
@pytest.mark.parametrize("collector_class", [MultiSyncCollector, MultiAsyncCollector])
def test_updates_from_another_thread_while_batches_are_awaited(collector_class: type) -> None:
    policy = policy_with_bias(0.0)
    collector = collector_class([pendulum, pendulum], policy, frames_per_batch=40, total_frames=-1)
    failures: list[BaseException] = []

    def send_updates() -> None:
        try:
            for value in range(1, UPDATES + 1):
                with torch.no_grad():
                    policy.module.bias.fill_(value / 100)
                collector.update_policy_weights_()
        except BaseException as error:  # reported by the main thread
            failures.append(error)

    sender = threading.Thread(target=send_updates)
    try:
        sender.start()
        while sender.is_alive():
            collector.next()
        sender.join()
        assert not failures, failures
        assert collector.policy_version == UPDATES
        # A batch launched after the last update runs the last weights.
        for _ in range(4):
            batch = collector.next()
        assert torch.allclose(batch["action"], torch.tensor(UPDATES / 100))
    finally:
        collector.shutdown()

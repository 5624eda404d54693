"""A short soak: env workers SIGKILLed at random while the collector runs and takes weights;
nothing handed out is wrong, doubled or out of order, and nothing is left over."""

from __future__ import annotations

import functools
import os
import random
import signal
import threading
import time

import pytest
import torch

from rlcollect import keys
from rlcollect.collectors import AsyncBatchedCollector
from tests.collectors.batched.batched_parts import counting_env, echo_module

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]
SOAK_SECONDS = 12.0
KILL_EVERY = 1.0


class Killer(threading.Thread):
    """SIGKILLs a random env worker every `every` seconds until stopped."""

    def __init__(self, collector: AsyncBatchedCollector, every: float) -> None:
        super().__init__(daemon=True)
        self.collector, self.every = collector, every
        self.kills = 0
        self.halt = threading.Event()
        self.random = random.Random(0)

    def run(self) -> None:
        while not self.halt.wait(self.every):
            pids = self.collector._inner.pool.pids
            if pids:
                try:
                    os.kill(self.random.choice(pids), signal.SIGKILL)
                    self.kills += 1
                except ProcessLookupError:
                    pass


@pytest.mark.parametrize("concurrent_forwards", [1, 2])
def test_random_worker_kills_lose_nothing_handed_out_and_double_nothing(
    concurrent_forwards: int,
) -> None:
    lengths = (3, 4, 5, 6)
    collector = AsyncBatchedCollector(
        [functools.partial(counting_env, length) for length in lengths],
        policy=echo_module(0.0),
        frames_per_batch=40,
        transition_chunk_size=10,
        restart_dead_workers=True,
        max_batch_size=2,
        concurrent_forwards=concurrent_forwards,
    )
    killer = Killer(collector, KILL_EVERY)
    steps_of: dict[int, list[int]] = {}
    biases = {0: 0.0}
    frames = 0
    try:
        killer.start()
        deadline = time.monotonic() + SOAK_SECONDS
        while time.monotonic() < deadline:
            batch = collector.next()
            versions = batch.get(keys.POLICY_VERSION)
            expected_bias = torch.zeros(versions.shape)
            for version in versions.unique().tolist():
                expected_bias[versions == version] = biases[version]
            answer = batch.get("observation") * 10.0 + expected_bias.unsqueeze(-1)
            assert torch.equal(batch.get("echo"), answer), "an answer went to the wrong row"
            ids = batch.get(keys.TRAJ_IDS).flatten().tolist()
            counts = batch.get("observation").flatten().long().tolist()
            for trajectory, count in zip(ids, counts, strict=True):
                steps_of.setdefault(trajectory, []).append(count)
            frames += batch.numel()
            bias = float(collector.policy_version + 1)
            collector.update_policy_weights_({"module.bias": torch.tensor(bias)})
            biases[collector.policy_version] = bias
        restarts = sum(worker["restarts"] for worker in collector.stats()["per_worker"])
    finally:
        killer.halt.set()
        killer.join()
        collector.shutdown()
    assert killer.kills >= SOAK_SECONDS / KILL_EVERY / 2
    assert restarts >= 1
    assert frames > 0
    # Every trajectory handed out runs 0, 1, 2, ... in order: none doubled, none skipped (a
    # killed worker's last one may stop early: its chunk in flight is never handed out).
    for trajectory, steps in steps_of.items():
        assert steps == list(range(len(steps))), f"trajectory {trajectory}: {steps[:12]}"

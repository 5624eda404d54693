"""Ctrl-C in a RayCollector's driver ends its actors (and what they run) and the driver itself
promptly; the driver joins the test run's cluster, which goes on."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import descendants, processes_gone

ray = pytest.importorskip("ray")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),  # start-up takes a minute or more on a loaded machine
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]
ROOT = Path(__file__).resolve().parents[3]
# Seconds from SIGINT to the driver's exit and its actors' end (under 2 s on an idle machine,
# about 3 s with the load average at 11 on 2 cores, benchmarks/ctrl_c.py): generous.
CTRL_C_SECONDS = 10.0
# The script restores Python's Ctrl-C handler: a child of `pytest &` inherits an ignored SIGINT.
SCRIPT = """
    import functools, signal
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from rlcollect.collectors import MultiSyncCollector, RayCollector

    collector = RayCollector(
        "CartPole-v1",
        num_collectors=2,
        frames_per_batch=400,
        {collector_class}
        ray_init_config={{"address": {address!r}, "log_to_driver": False}},
        remote_configs={{"num_cpus": 0}},
    )
    print(" ".join(map(str, collector.process_ids())), flush=True)
    while True:
        collector.next()
"""


@pytest.mark.parametrize(
    "collector_class",
    ["", "collector_class=functools.partial(MultiSyncCollector, num_workers=2),"],
    ids=["actors", "actors-with-workers"],
)
def test_ctrl_c_in_the_driver_ends_its_actors_and_itself_promptly(
    ray_cluster: str, collector_class: str
) -> None:
    script = textwrap.dedent(SCRIPT).format(collector_class=collector_class, address=ray_cluster)
    process = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        actors = [int(pid) for pid in process.stdout.readline().split()]
        assert actors, process.stderr.read()
        time.sleep(0.5)  # batches in flight
        ours = sorted({*actors, *descendants(process.pid)})
        process.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, stderr = process.communicate(timeout=CTRL_C_SECONDS)
        every_process_gone = processes_gone(ours, CTRL_C_SECONDS - (time.monotonic() - sent))
    finally:
        process.kill()
        process.wait()
    assert "KeyboardInterrupt" in stderr
    assert every_process_gone, f"still running {CTRL_C_SECONDS} s after Ctrl-C: {ours}"
    assert ray.is_initialized(), "the test run's cluster goes on"

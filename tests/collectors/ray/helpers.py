"""Helpers of the Ray tests: picklable env makers and a look at a RayCollector's actors."""

from __future__ import annotations

import functools
import time
from typing import Any

# Seconds within which a failed or dead actor must be reported (the promise).
REPORT_SECONDS = 10.0
# A Ray test's bound: building actors (a fresh interpreter importing torch each) took minutes
# on a busy 2-core machine; this bounds a hang, not how fast the machine is (what must be
# prompt, such as REPORT_SECONDS, is bounded inside the tests).
RAY_TEST_TIMEOUT = 300


def counting_env(episode_length: int = 4) -> Any:
    """A picklable maker of the deterministic counting env (importable by Ray workers)."""
    from rlcollect.testing import CountingEnv

    return functools.partial(CountingEnv, episode_length=episode_length)


def actor_handles(collector: Any) -> list[Any]:
    """The Ray actor handles of a RayCollector, actor by actor."""
    return [slot.handle for slot in collector.fleet.slots]


def wait_for_free_cpus(cpus: float, within: float = 30.0) -> None:
    """Wait until the cluster has `cpus` CPUs free (Ray frees a killed actor's CPU a moment
    after the kill), so that the next test's actors are scheduled at once."""
    import ray

    deadline = time.monotonic() + within
    while ray.available_resources().get("CPU", 0.0) < cpus and time.monotonic() < deadline:
        time.sleep(0.05)


def extend_through(client: Any, frames: int) -> None:
    """Extend a Ray-served buffer with `frames` frames through its client, from a process
    that Ray did not start (the client joins the cluster itself)."""
    import torch
    from tensordict import TensorDict

    client.extend(TensorDict({"observation": torch.arange(float(frames))}, [frames]))

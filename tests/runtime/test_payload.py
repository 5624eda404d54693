"""`WorkerPayload`: cloudpickle for what a worker builds from, with the objects only
multiprocessing may send set aside, and sent by multiprocessing as the worker starts: a
shared value, a lock and a queue reach real worker processes shared with this one."""

from __future__ import annotations

import multiprocessing
import pickle
from typing import Any

import cloudpickle
import pytest

from rlcollect.runtime.payload import WorkerPayload, is_shared_on_start
from rlcollect.runtime.processes import worker_context

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leftover_children")]
SPAWNING = multiprocessing.get_context("spawn")  # named semaphores: any start method takes them


def count_and_report(payload: WorkerPayload) -> None:
    """A worker's target: add one to the shared count under its lock, say so on the queue."""
    shared = payload.load()
    with shared["lock"]:
        shared["count"].value += shared["step"]()
    shared["queue"].put(shared["count"].value)


def shared_parts() -> dict[str, Any]:
    step = 1
    return {
        "count": SPAWNING.Value("i", 0),
        "lock": SPAWNING.Lock(),
        "queue": SPAWNING.SimpleQueue(),
        "step": lambda: step,  # a closure: cloudpickle's part
    }


def test_cloudpickle_alone_cannot_send_a_shared_value() -> None:
    with pytest.raises(RuntimeError, match="Synchronized objects should only be shared"):
        cloudpickle.dumps(shared_parts())


def test_shared_objects_are_set_aside_once_and_put_back_in_place() -> None:
    parts = shared_parts()
    payload = WorkerPayload({"parts": parts, "again": parts["count"], "plain": [1, 2]})
    assert [type(obj).__name__ for obj in payload.aside] == [
        "Synchronized",
        "Lock",
        "SimpleQueue",
    ]
    loaded = payload.load()
    assert loaded["parts"]["count"] is loaded["again"] is parts["count"]
    assert loaded["parts"]["step"]() == 1
    assert loaded["plain"] == [1, 2]
    assert is_shared_on_start(SPAWNING.RawValue("d", 0.5))
    assert not is_shared_on_start(pickle)


@pytest.mark.parametrize("start_method", ["forkserver"])
def test_workers_given_a_payload_share_its_objects_with_this_process(start_method: str) -> None:
    parts = shared_parts()
    payload = WorkerPayload(parts)
    context = worker_context(start_method)
    workers = [context.Process(target=count_and_report, args=(payload,)) for _ in range(2)]
    for worker in workers:
        worker.start()
    reports = sorted(parts["queue"].get() for _ in workers)
    for worker in workers:
        worker.join(timeout=60)
    assert [worker.exitcode for worker in workers] == [0, 0]
    assert reports == [1, 2]  # one counter, counted in by both
    assert parts["count"].value == 2

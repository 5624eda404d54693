"""`WorkerPayload`: cloudpickle for what a worker builds from, with the objects only
multiprocessing may send set aside, and sent by multiprocessing as the worker starts: a
shared value, a lock and a queue reach real worker processes shared with this one, and so do
tensors in shared memory when the payload is asked to share them."""

from __future__ import annotations

import multiprocessing
import pickle
from typing import Any

import cloudpickle
import pytest
import torch

from rlcollect.runtime.payload import (
    DESCRIPTOR_BUDGET,
    WorkerPayload,
    is_shared_on_start,
    is_shared_tensor,
)
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


# --- tensors in shared memory -----------------------------------------------------------------


def write_through(payload: WorkerPayload, row: int) -> None:
    """A worker's target: write its row of the shared board, then read the whole board back
    into its report row once every worker has written (so each sees the others' writes)."""
    parts = payload.load()
    board, done = parts["board"], parts["done"]
    board[row] = row + 1.0
    with done.get_lock():
        done.value += 1
    while done.value < board.shape[0] - 1:
        pass
    parts["reports"][row] = board


def test_shared_tensors_are_set_aside_only_when_asked() -> None:
    shared, plain = torch.zeros(2).share_memory_(), torch.zeros(2)
    value = {"shared": shared, "view": shared[1:], "plain": plain}
    assert WorkerPayload(value).aside == []
    aside = WorkerPayload(value, share_tensors=True).aside
    assert [item is shared for item in aside] == [True, False]  # the view travels as itself
    loaded = WorkerPayload(value, share_tensors=True).load()
    assert loaded["shared"] is shared
    assert loaded["plain"] is not plain
    assert not is_shared_tensor(plain)
    assert not is_shared_tensor(torch.zeros(1, requires_grad=True).share_memory_() * 2)


def test_a_payload_in_a_payload_travels_whole_and_is_loaded_in_place() -> None:
    shared = torch.zeros(1).share_memory_()
    inner = WorkerPayload({"board": shared}, share_tensors=True)
    outer = WorkerPayload({"maker": inner, "again": inner, "own": shared})
    assert outer.aside == [inner]  # the outer payload copies its own tensors
    loaded = outer.load()
    assert loaded["maker"]["board"] is shared
    assert loaded["again"] is loaded["maker"]
    assert loaded["own"] is not shared


@pytest.mark.parametrize("start_method", ["forkserver", "spawn", "fork"])
def test_workers_write_into_shared_tensors_seen_here_and_by_each_other(start_method: str) -> None:
    board = torch.zeros(3).share_memory_()  # a row per worker; the last is this process's
    board[2] = 7.0
    reports = torch.zeros(2, 3).share_memory_()
    done = SPAWNING.Value("i", 0)
    payload = WorkerPayload({"board": board, "done": done, "reports": reports}, share_tensors=True)
    context = worker_context(start_method)
    workers = [context.Process(target=write_through, args=(payload, row)) for row in (0, 1)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert [worker.exitcode for worker in workers] == [0, 0]
    assert board.tolist() == [1.0, 2.0, 7.0]  # both writes reached this process
    assert reports.tolist() == [[1.0, 2.0, 7.0]] * 2  # and each worker saw the other's


def test_a_maker_with_more_shared_storages_than_descriptors_is_copied_with_a_warning() -> None:
    many = [torch.zeros(1).share_memory_() for _ in range(DESCRIPTOR_BUDGET + 1)]
    expected = r"tensors in 129 shared-memory storages, more than the 128 a worker"
    with pytest.warns(UserWarning, match=expected):
        payload = WorkerPayload(many, share_tensors=True)
    assert payload.aside == []
    assert WorkerPayload(many[:DESCRIPTOR_BUDGET], share_tensors=True).aside == many[:-1]

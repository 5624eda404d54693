"""LazyMemmapStorage survives a writer killed with SIGKILL: completed extends stay, torn ones go."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from rlcollect.replay import LazyMemmapStorage, ReplayBuffer
from tests.replay.replay_workers import (
    die_mid_write,
    extend_until_killed,
    is_consistent,
    payload_batch,
)

CONTEXT = multiprocessing.get_context("fork")


def reported_last_ids(report: Path) -> list[int]:
    try:
        return [int(line) for line in report.read_text().split()]
    except FileNotFoundError:
        return []


def window_items(buffer: ReplayBuffer):
    storage = buffer.storage
    start = storage.log.window_start(storage.max_size)
    return buffer[(torch.arange(len(buffer)) + start) % storage.max_size]


def kill_while_extending(directory: Path, max_size: int, chunk: int, extends: int) -> int:
    """Runs a writer, kills it after ``extends`` reported extends; returns the last reported id."""
    report = directory.parent / f"{directory.name}.report"
    writer = CONTEXT.Process(
        target=extend_until_killed, args=(str(directory), max_size, str(report), chunk)
    )
    writer.start()
    deadline = time.monotonic() + 60
    while len(reported_last_ids(report)) < extends and time.monotonic() < deadline:
        time.sleep(0.001)
    os.kill(writer.pid, signal.SIGKILL)
    writer.join()
    assert writer.exitcode == -signal.SIGKILL
    reports = reported_last_ids(report)
    assert len(reports) >= extends, "the writer did not get going"
    return reports[-1]


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children")
@pytest.mark.parametrize("round_", range(4))
def test_killed_writer_leaves_every_returned_extend_and_no_torn_item(
    tmp_path: Path, round_: int
) -> None:
    directory = tmp_path / "buffer"
    last_reported = kill_while_extending(directory, 200_000, chunk=257, extends=20 + 15 * round_)
    buffer = ReplayBuffer(storage=LazyMemmapStorage.open(directory))
    items = window_items(buffer)
    assert len(buffer) == buffer.write_count > last_reported
    assert items["id"].tolist() == list(range(len(buffer)))
    assert is_consistent(items).all()


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children")
def test_killed_writer_that_was_overwriting_old_items(tmp_path: Path) -> None:
    directory = tmp_path / "buffer"
    last_reported = kill_while_extending(directory, 5000, chunk=257, extends=60)
    buffer = ReplayBuffer(storage=LazyMemmapStorage.open(directory))
    items = window_items(buffer)
    newest = int(items["id"][-1])
    assert newest + 1 == buffer.write_count > last_reported
    assert items["id"].tolist() == list(range(newest + 1 - len(buffer), newest + 1))
    assert is_consistent(items).all()
    assert len(buffer) >= 5000 - 257  # at most one batch of old items was torn and dropped


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leftover_children")
@pytest.mark.parametrize(
    ("before", "count", "kept"),
    [
        (10, 6, list(range(10))),  # torn slots lie past the end: nothing to drop
        (20, 6, list(range(6, 20))),  # a full buffer: the six oldest slots were being rewritten
        (17, 6, list(range(3, 17))),  # the write wraps into slots 0..2, the oldest items
    ],
)
def test_a_write_cut_short_is_rolled_back_on_reopen(
    tmp_path: Path, before: int, count: int, kept: list[int]
) -> None:
    directory = tmp_path / "buffer"
    buffer = ReplayBuffer(storage=LazyMemmapStorage(20, scratch_dir=directory))
    buffer.extend(payload_batch(0, before))
    child = CONTEXT.Process(target=die_mid_write, args=(str(directory), 20, count, count // 2))
    child.start()
    child.join()
    assert child.exitcode == -signal.SIGKILL
    reopened = ReplayBuffer(storage=LazyMemmapStorage.open(directory))
    items = window_items(reopened)
    assert items["id"].tolist() == kept
    assert is_consistent(items).all()
    assert reopened.write_count == before
    assert window_items(buffer)["id"].tolist() == kept  # a live process sees the repair too
    reopened.extend(payload_batch(before, 3))
    assert window_items(reopened)["id"].tolist()[-3:] == [before, before + 1, before + 2]

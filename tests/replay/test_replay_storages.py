"""Storages: one conformance check run by every storage, then each storage's own behaviour."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from rlcollect.errors import MisuseError
from rlcollect.replay import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    Storage,
)
from rlcollect.replay.storage_directory import LAYOUT_FILE
from tests.replay.replay_workers import transitions


def make_storage(kind: str, max_size: int, tmp_path: Path) -> Storage:
    if kind == "list":
        return ListStorage(max_size)
    if kind == "tensor":
        return LazyTensorStorage(max_size)
    return LazyMemmapStorage(max_size, scratch_dir=tmp_path / "memmap")


STORAGES = ["list", "tensor", "memmap"]


def stored_ids(buffer: ReplayBuffer) -> list[int]:
    """Ids of the stored items from the oldest to the newest."""
    storage = buffer.storage
    start = storage.log.window_start(storage.max_size)
    slots = (torch.arange(len(storage)) + start) % storage.max_size
    return [int(i) for i in buffer[slots]["id"]]


@pytest.mark.parametrize("kind", STORAGES)
def test_storage_contract(kind: str, tmp_path: Path) -> None:
    buffer = ReplayBuffer(storage=make_storage(kind, 10, tmp_path))
    assert len(buffer) == 0
    assert buffer.write_count == 0
    assert buffer.extend(transitions(4)).tolist() == [0, 1, 2, 3]
    assert buffer.extend(transitions(4, first=4)).tolist() == [4, 5, 6, 7]
    assert buffer.extend(transitions(4, first=8)).tolist() == [8, 9, 0, 1]
    assert len(buffer) == 10
    assert buffer.write_count == 12
    assert stored_ids(buffer) == list(range(2, 12))
    assert buffer.add(transitions(1, first=12)[0]) == 2
    item = buffer[3]
    assert int(item["id"]) == 3
    assert item.batch_size == torch.Size([])
    restored = ReplayBuffer(storage=make_storage(kind, 10, tmp_path / "copy"))
    restored.load_state_dict(buffer.state_dict())
    assert stored_ids(restored) == stored_ids(buffer) == list(range(3, 13))
    assert restored.write_count == 13
    buffer.empty()
    assert len(buffer) == 0
    assert buffer.write_count == 0


@pytest.mark.parametrize("kind", ["tensor", "memmap"])
def test_multi_dim_batches_are_flattened_to_frames(kind: str, tmp_path: Path) -> None:
    buffer = ReplayBuffer(storage=make_storage(kind, 100, tmp_path))
    batch = transitions(24).reshape(4, 6)
    batch.names = [None, "time"]
    index = buffer.extend(batch)
    assert index.tolist() == list(range(24))
    assert buffer[index]["id"].tolist() == list(range(24))
    assert buffer[index]["next", "observation"].shape == torch.Size([24, 4])


@pytest.mark.parametrize("kind", STORAGES)
def test_batch_larger_than_storage_keeps_the_newest(kind: str, tmp_path: Path) -> None:
    buffer = ReplayBuffer(storage=make_storage(kind, 5, tmp_path))
    buffer.extend(transitions(2))
    index = buffer.extend(transitions(12, first=2))
    assert index.tolist() == [(2 + i) % 5 for i in range(12)]
    assert stored_ids(buffer) == list(range(9, 14))
    assert buffer.write_count == 14


def test_list_storage_holds_any_object() -> None:
    buffer = ReplayBuffer(storage=ListStorage(4))
    buffer.extend(["a", {"b": 1}, None])
    buffer.add(("tuple", 2))
    assert buffer[torch.tensor([0, 1, 2, 3])] == ["a", {"b": 1}, None, ("tuple", 2)]
    numbers = ReplayBuffer(storage=ListStorage(4))
    numbers.extend([1, 2, 3])
    assert torch.equal(numbers[torch.tensor([2, 0])], torch.tensor([3, 1]))


def test_tensor_storage_of_plain_tensors() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(6), batch_size=4)
    buffer.extend(torch.arange(8).reshape(4, 2))
    assert buffer.sample().shape == torch.Size([4, 2])
    assert buffer[torch.tensor([1])].tolist() == [[2, 3]]


@pytest.mark.parametrize("max_size", [0, -3, 2.5, True])
def test_bad_max_size_is_refused(max_size: object, tmp_path: Path) -> None:
    message = rf"max_size must be a positive int, got {max_size!r}; .* e.g. max_size=100_000"
    for make in (ListStorage, LazyTensorStorage):
        with pytest.raises(ValueError, match=message):
            make(max_size)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        LazyMemmapStorage(max_size, scratch_dir=tmp_path / "new")  # type: ignore[arg-type]
    assert not (tmp_path / "new").exists(), "a refused storage left files behind"
    # a refused size leaves a storage already in the directory as it was
    directory = tmp_path / "existing"
    ReplayBuffer(storage=LazyMemmapStorage(6, scratch_dir=directory)).extend(transitions(8))
    files = sorted(path.name for path in directory.iterdir())
    with pytest.raises(ValueError, match=message):
        LazyMemmapStorage(max_size, scratch_dir=directory)  # type: ignore[arg-type]
    assert sorted(path.name for path in directory.iterdir()) == files
    reopened = ReplayBuffer(storage=LazyMemmapStorage.open(directory))
    assert stored_ids(reopened) == list(range(2, 8))
    assert reopened.write_count == 8


def assert_same_storage_state(state: dict, expected: dict) -> None:
    assert state["layout"] == expected["layout"]
    assert state["log"] == expected["log"]
    for leaf, saved in zip(state["leaves"], expected["leaves"], strict=True):
        assert torch.equal(leaf, saved)


@pytest.mark.parametrize("kind", ["tensor", "memmap", "shared"])
def test_mismatched_batches_raise_and_change_nothing(kind: str, tmp_path: Path) -> None:
    storage = make_storage("tensor" if kind == "shared" else kind, 10, tmp_path)
    buffer = ReplayBuffer(storage=storage, shared=kind == "shared")
    buffer.extend(transitions(3))
    before = buffer.state_dict()
    with pytest.raises(ValueError, match=r"missing \['id'\], unexpected \['other'\]"):
        buffer.extend(transitions(2).rename_key_("id", "other"))
    bad = transitions(2)
    bad["observation"] = torch.zeros(2, 5)
    with pytest.raises(ValueError, match=r"entry 'observation' has shape \(2, 5\)"):
        buffer.extend(bad)
    with pytest.raises(ValueError, match=r"missing \[\('next', 'reward'\)\]"):
        buffer.extend(transitions(2).exclude(("next", "reward")))
    with pytest.raises(ValueError, match="use add\\(\\) for one item"):
        buffer.extend(transitions(1)[0])
    with pytest.raises(ValueError, match=r"entry 'id' has shape \(30, 2\), expected .* shape \(\)"):
        buffer.extend(transitions(30).set("id", torch.zeros(30, 2, dtype=torch.long)))  # > max_size
    with pytest.raises(TypeError, match="this storage holds TensorDicts; got a plain tensor"):
        buffer.extend(torch.zeros(4, 3))
    after = buffer.state_dict()
    assert after["writer"] == before["writer"]
    assert_same_storage_state(after["storage"], before["storage"])
    assert stored_ids(buffer) == [0, 1, 2]
    buffer.close()


def test_mismatched_tensor_batches_raise_and_change_nothing() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(6))
    buffer.extend(torch.arange(8.0).reshape(4, 2))
    before = buffer.state_dict()
    with pytest.raises(ValueError, match=r"entry tensor has shape \(3, 5\), expected .* \(2,\)"):
        buffer.extend(torch.zeros(3, 5))
    with pytest.raises(TypeError, match="this storage holds tensors; got a TensorDict"):
        buffer.extend(transitions(2))
    assert_same_storage_state(buffer.state_dict()["storage"], before["storage"])


def test_reading_an_unwritten_tensor_storage_is_misuse() -> None:
    with pytest.raises(MisuseError, match="holds no data yet"):
        LazyTensorStorage(4).get(torch.tensor([0]))


def test_memmap_storage_reopens_from_its_directory(tmp_path: Path) -> None:
    directory = tmp_path / "buffer"
    buffer = ReplayBuffer(storage=LazyMemmapStorage(8, scratch_dir=directory))
    buffer.extend(transitions(11))
    assert (directory / LAYOUT_FILE).exists()
    reopened = ReplayBuffer(storage=LazyMemmapStorage.open(directory))
    assert len(reopened) == 8
    assert reopened.write_count == 11
    assert stored_ids(reopened) == list(range(3, 11))
    reopened.extend(transitions(2, first=11))
    assert stored_ids(buffer) == list(range(5, 13))  # both map the same files
    with pytest.raises(ValueError, match="holds a storage of max_size=8, not max_size=9"):
        LazyMemmapStorage(9, scratch_dir=directory)
    with pytest.raises(FileNotFoundError, match="holds no storage"):
        LazyMemmapStorage.open(tmp_path / "empty")


def test_memmap_temporary_directory_is_removed_on_close() -> None:
    storage = LazyMemmapStorage(4)
    directory = storage.scratch_dir
    ReplayBuffer(storage=storage).extend(transitions(2))
    assert directory.exists()
    storage.close()
    assert not directory.exists()


def test_durable_memmap_writes_are_readable(tmp_path: Path) -> None:
    buffer = ReplayBuffer(storage=LazyMemmapStorage(5, scratch_dir=tmp_path, durable=True))
    buffer.extend(transitions(7))
    assert stored_ids(buffer) == [2, 3, 4, 5, 6]


def test_pickling_a_non_shared_buffer_outside_a_spawn_makes_a_copy() -> None:
    # Pickling outside a process spawn makes an independent copy, which is allowed.
    buffer = ReplayBuffer(storage=LazyTensorStorage(4))
    buffer.extend(transitions(2))
    copy = pickle.loads(pickle.dumps(buffer))
    copy.extend(transitions(1, first=2))
    assert len(copy) == 3
    assert len(buffer) == 2


def test_memmap_storage_pickles_as_a_handle(tmp_path: Path) -> None:
    buffer = ReplayBuffer(storage=LazyMemmapStorage(6, scratch_dir=tmp_path))
    buffer.extend(transitions(2))
    handle = pickle.loads(pickle.dumps(buffer))
    handle.extend(transitions(2, first=2))
    assert stored_ids(buffer) == [0, 1, 2, 3]


def test_storage_on_an_accelerator_cannot_be_shared() -> None:
    storage = LazyTensorStorage(4, device="meta")
    with pytest.raises(ValueError, match="lives in CPU shared memory"):
        ReplayBuffer(storage=storage, shared=True)


def test_sampled_tensordict_carries_index(tmp_path: Path) -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=6)
    buffer.extend(transitions(10))
    sample = buffer.sample()
    assert isinstance(sample, TensorDict)
    assert torch.equal(sample["id"], sample["index"])


def test_a_list_of_tensordicts_is_stacked_into_frames() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(8))
    items = list(transitions(3).unbind(0))
    assert buffer.extend(items).tolist() == [0, 1, 2]
    assert buffer[torch.arange(3)]["id"].tolist() == [0, 1, 2]


def test_an_item_read_by_int_is_a_copy() -> None:
    buffer = ReplayBuffer(storage=LazyMemmapStorage(4))
    buffer.extend(transitions(2))
    item = buffer[1]
    buffer.extend(transitions(4, first=10))  # overwrites slot 1
    assert int(item["id"]) == 1
    buffer.close()


def test_opening_a_missing_storage_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="holds no storage"):
        LazyMemmapStorage.open(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("kind", STORAGES)
def test_storages_index_by_slice_list_and_tensor(kind: str, tmp_path: Path) -> None:
    storage = make_storage(kind, 10, tmp_path)
    ReplayBuffer(storage=storage).extend(transitions(6))
    assert [int(i) for i in storage[:]["id"]] == list(range(6)), "a slice covers stored items"
    assert [int(i) for i in storage[1:5:2]["id"]] == [1, 3]
    assert [int(i) for i in storage[[4, 0]]["id"]] == [4, 0]
    assert [int(i) for i in storage[torch.tensor([5, 2])]["id"]] == [5, 2]
    assert int(storage[torch.tensor(3)]["id"]) == 3

"""ReplayBuffer: the API, saving and loading, transforms, prefetching, and TorchRL parity."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from rlcollect.replay import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    Storage,
)
from tests.replay.replay_workers import transitions


def make_storage(kind: str, max_size: int, path: Path) -> Storage:
    if kind == "list":
        return ListStorage(max_size)
    if kind == "tensor":
        return LazyTensorStorage(max_size)
    return LazyMemmapStorage(max_size, scratch_dir=path)


def prioritized(kind: str, path: Path, seed: int) -> ReplayBuffer:
    return ReplayBuffer(
        storage=make_storage(kind, 20, path),
        sampler=PrioritizedSampler(20, alpha=0.8, beta=0.4),
        batch_size=7,
        generator=torch.Generator().manual_seed(seed),
    )


@pytest.mark.parametrize("kind", ["list", "tensor", "memmap"])
@pytest.mark.parametrize("through", ["dumps", "state_dict"])
def test_save_and_load_round_trip_exactly(kind: str, through: str, tmp_path: Path) -> None:
    buffer = prioritized(kind, tmp_path / "a", seed=0)
    buffer.extend(transitions(26))
    _, info = buffer.sample(return_info=True)
    buffer.update_priority(info["index"], torch.arange(7.0) + 0.5)
    buffer.extend(transitions(3, first=26))  # new items get the max priority, lazily
    if through == "dumps":
        buffer.dumps(tmp_path / "saved")
        restored = prioritized(kind, tmp_path / "b", seed=1)
        restored.loads(tmp_path / "saved")
    else:
        restored = prioritized(kind, tmp_path / "b", seed=1)
        restored.load_state_dict(buffer.state_dict())
    assert (
        restored.writer.state_dict()
        == buffer.writer.state_dict()
        == {"cursor": 9, "write_count": 29}
    )
    assert len(restored) == len(buffer) == 20
    assert restored.storage.log.snapshot() == buffer.storage.log.snapshot() == (9, 20, 29)
    every = torch.arange(20)
    saved, loaded = buffer[every], restored[every]
    assert set(loaded.keys(True, True)) == set(saved.keys(True, True))
    for key in saved.keys(True, True):  # every entry of every slot, bit for bit
        assert torch.equal(loaded[key], saved[key]), key
    saved_sampler, loaded_sampler = buffer.sampler.state_dict(), restored.sampler.state_dict()
    assert torch.equal(loaded_sampler.pop("weights"), saved_sampler.pop("weights"))
    assert loaded_sampler == saved_sampler  # max priority, alpha, beta, eps, what it has seen
    buffer.sampler.generator.manual_seed(5)
    restored.sampler.generator.manual_seed(5)
    original_draw = buffer.sample(return_info=True)[1]
    restored_draw = restored.sample(return_info=True)[1]
    assert torch.equal(original_draw["index"], restored_draw["index"])
    assert torch.equal(original_draw["priority_weight"], restored_draw["priority_weight"])
    for copy in (buffer, restored):  # both go on writing at the same cursor
        assert copy.extend(transitions(2, first=29)).tolist() == [9, 10]
        assert copy.write_count == 31


def test_loading_into_a_storage_of_another_size_fails(tmp_path: Path) -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(8))
    buffer.extend(transitions(3))
    buffer.dumps(tmp_path / "saved")
    other = ReplayBuffer(storage=LazyTensorStorage(9))
    with pytest.raises(ValueError, match="max_size=8 frames but this one holds max_size=9"):
        other.loads(tmp_path / "saved")


def test_add_extend_len_and_write_count_match_torchrl() -> None:
    torchrl_data = pytest.importorskip("torchrl.data")
    theirs = torchrl_data.ReplayBuffer(storage=torchrl_data.LazyTensorStorage(7))
    ours = ReplayBuffer(storage=LazyTensorStorage(7))
    for buffer in (theirs, ours):
        indices = [buffer.extend(transitions(3, first=3 * i)).tolist() for i in range(4)]
        indices.append(buffer.add(transitions(1, first=12)[0]))
        buffer.record = (indices, len(buffer), buffer.write_count)  # type: ignore[attr-defined]
    assert ours.record == theirs.record  # type: ignore[attr-defined]


def test_collector_batches_are_flattened_in_frame_order() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=8)
    batch = transitions(30).reshape(3, 10)  # [envs, time], as a collector yields it
    batch.names = [None, "time"]
    assert buffer.extend(batch).tolist() == list(range(30))
    assert buffer[torch.arange(30)]["id"].tolist() == batch["id"].reshape(-1).tolist()
    assert buffer[:30]["id"].tolist() == batch["id"].reshape(-1).tolist()  # as the storage
    assert buffer[[2, 0]]["id"].tolist() == batch["id"].reshape(-1)[[2, 0]].tolist()
    sample = buffer.sample()
    assert sample.batch_size == torch.Size([8])
    assert torch.equal(sample["id"], sample["index"])


def test_iteration_and_empty() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(10), sampler=RandomSampler(), batch_size=3)
    buffer.extend(transitions(5))
    batches = list(itertools.islice(buffer, 4))
    assert [len(batch) for batch in batches] == [3, 3, 3, 3]
    buffer.empty()
    assert len(buffer) == 0
    assert buffer.write_count == 0
    assert buffer.extend(transitions(2)).tolist() == [0, 1]


def test_extend_of_nothing_writes_nothing() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(4))
    buffer.extend(transitions(1))
    assert buffer.extend(transitions(0)).tolist() == []
    assert buffer.write_count == 1


def test_transform_runs_on_samples_and_its_inverse_on_writes() -> None:
    class Scale:
        def __call__(self, data: TensorDict) -> TensorDict:
            data["observation"] = data["observation"] * 10
            return data

        def inv(self, data: TensorDict) -> TensorDict:
            data = data.clone()
            data["observation"] = data["observation"] + 1
            return data

    buffer = ReplayBuffer(storage=LazyTensorStorage(4), transform=Scale(), batch_size=2)
    buffer.extend(transitions(4))
    sample = buffer.sample()
    assert torch.equal(sample["observation"][:, 0], (sample["id"].float() + 1) * 10)


def test_prefetch_serves_batches() -> None:
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(50),
        sampler=SamplerWithoutReplacement(),
        batch_size=10,
        prefetch=2,
    )
    buffer.extend(transitions(50))
    ids = torch.cat([buffer.sample()["id"] for _ in range(5)])
    assert sorted(ids.tolist()) == list(range(50))
    buffer.close()


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"storage": "big"}, TypeError, r"storage must be a Storage \(e.g. LazyTensorStorage"),
        ({"sampler": RandomSampler}, TypeError, "sampler must be a Sampler"),
        ({"writer": object()}, TypeError, "writer must be a Writer"),
        ({"prefetch": 2}, ValueError, "prefetch needs a fixed batch size"),
        ({"prefetch": 2, "batch_size": 4, "shared": True}, ValueError, "cannot prefetch"),
        ({"storage": ListStorage(4), "shared": True}, ValueError, "ListStorage cannot be shared"),
    ],
)
def test_constructor_arguments_are_checked(arguments: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        ReplayBuffer(**arguments)


def test_iterating_needs_a_batch_size() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(4))
    with pytest.raises(ValueError, match="iterating over a buffer needs a batch_size"):
        next(iter(buffer))

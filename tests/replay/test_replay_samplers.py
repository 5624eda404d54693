"""Samplers: draw distributions (chi-square on 10^5 draws), priorities, weights, epochs, errors."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rlcollect.errors import MisuseError
from rlcollect.replay import (
    LazyTensorStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
)
from tests.replay.chi_square import chi_square, chi_square_critical
from tests.replay.replay_workers import transitions

DRAWS = 100_000
ALPHA, BETA, EPS = 0.7, 0.6, 1e-8


def counts(buffer: ReplayBuffer, size: int) -> torch.Tensor:
    """How often each slot comes up in ``DRAWS`` draws."""
    index = torch.cat([buffer.sample(10_000, return_info=True)[1]["index"] for _ in range(10)])
    return torch.bincount(index, minlength=size)


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_random_sampler_is_uniform_over_the_stored_items() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(100), generator=seeded())
    buffer.extend(torch.arange(60))
    observed = counts(buffer, 100)
    assert observed[60:].sum() == 0
    uniform = torch.full((60,), 1 / 60)
    assert chi_square(observed[:60], uniform) < chi_square_critical(59)
    skewed = torch.linspace(1, 2, 60) / torch.linspace(1, 2, 60).sum()
    assert chi_square(observed[:60], skewed) > chi_square_critical(59)


def prioritized_buffer(size: int, priorities: torch.Tensor) -> ReplayBuffer:
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(size),
        sampler=PrioritizedSampler(size, alpha=ALPHA, beta=BETA, eps=EPS),
        generator=seeded(1),
    )
    index = buffer.extend(TensorDict({"id": torch.arange(size)}, [size]))
    buffer.update_priority(index, priorities)
    return buffer


def expected(priorities: torch.Tensor) -> torch.Tensor:
    weights = (priorities.double() + EPS) ** ALPHA
    return weights / weights.sum()


def test_prioritized_draws_follow_the_priorities_and_their_updates() -> None:
    priorities = torch.arange(1, 41, dtype=torch.float64)
    buffer = prioritized_buffer(40, priorities)
    observed = counts(buffer, 40)
    assert chi_square(observed, expected(priorities)) < chi_square_critical(39)
    reversed_priorities = priorities.flip(0)
    buffer.update_priority(torch.arange(40), reversed_priorities)
    after = counts(buffer, 40)
    assert chi_square(after, expected(reversed_priorities)) < chi_square_critical(39)
    assert chi_square(after, expected(priorities)) > 100 * chi_square_critical(39)


def test_importance_weights_are_normalised_inverse_probabilities() -> None:
    priorities = torch.rand(30, generator=seeded(2), dtype=torch.float64) * 10
    buffer = prioritized_buffer(30, priorities)
    sample, info = buffer.sample(500, return_info=True)
    probability = expected(priorities)
    weights = (30 * probability) ** -BETA
    reference = weights / weights.max()
    assert torch.allclose(info["priority_weight"].double(), reference[info["index"]], rtol=1e-5)
    assert torch.equal(sample["priority_weight"], info["priority_weight"])


def test_new_items_get_the_largest_priority_seen() -> None:
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(20),
        sampler=PrioritizedSampler(20, ALPHA, BETA, EPS),
        generator=seeded(),
    )
    buffer.extend(torch.arange(10))
    buffer.update_priority(torch.arange(10), torch.tensor([0.5] * 9 + [4.0]))
    buffer.extend(torch.arange(10, 15))
    probability = expected(torch.tensor([0.5] * 9 + [4.0] * 6))
    observed = counts(buffer, 20)[:15]
    assert chi_square(observed, probability) < chi_square_critical(14)
    assert buffer.sampler.max_priority == 4.0


def test_alpha_zero_is_uniform() -> None:
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(25), sampler=PrioritizedSampler(25, alpha=0.0, beta=1.0)
    )
    buffer.extend(torch.arange(25))
    buffer.update_priority(torch.arange(25), torch.arange(25.0))
    _, info = buffer.sample(50, return_info=True)
    assert torch.allclose(info["priority_weight"], torch.ones(50))
    observed = counts(buffer, 25)
    assert chi_square(observed, torch.full((25,), 1 / 25)) < chi_square_critical(24)


@pytest.mark.parametrize(
    ("priority", "message"),
    [
        (torch.tensor([1.0, -0.5, 2.0]), r"finite and >= 0, got \[-0.5\] at positions \[1\]"),
        (
            torch.tensor([float("nan"), 1.0, 2.0]),
            r"finite and >= 0, got \[nan\] at positions \[0\]",
        ),
        (torch.tensor([1.0, 2.0, float("inf")]), r"finite and >= 0, got \[inf\]"),
        (torch.tensor([1.0, 2.0]), "got 2 priorities for 3 indices"),
    ],
)
def test_bad_priorities_raise_and_change_nothing(priority: torch.Tensor, message: str) -> None:
    buffer = prioritized_buffer(5, torch.arange(1.0, 6.0))
    before = buffer.sampler.state_dict()
    with pytest.raises(ValueError, match=message):
        buffer.update_priority(torch.tensor([0, 1, 2]), priority)
    assert_same_state(buffer.sampler.state_dict(), before)


def test_priorities_of_empty_slots_are_refused() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(10), sampler=PrioritizedSampler(10, 1.0, 1.0))
    buffer.extend(torch.arange(4))
    buffer.sample(1)  # the new items got their priority
    before = buffer.sampler.state_dict()
    with pytest.raises(ValueError, match=r"indices \[7, 10\] hold no stored item"):
        buffer.update_priority(torch.tensor([1, 7, 10]), 5.0)
    assert_same_state(buffer.sampler.state_dict(), before)


def test_prioritized_sampler_must_cover_the_storage() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(10), sampler=PrioritizedSampler(5, 1.0, 1.0))
    buffer.extend(torch.arange(3))
    with pytest.raises(ValueError, match="build it with max_capacity >= 10"):
        buffer.sample(2)


@pytest.mark.parametrize("name", ["random", "without_replacement", "prioritized", "slice"])
def test_sampling_an_empty_buffer_is_misuse_and_changes_nothing(name: str) -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(32), sampler=SAMPLERS[name](), batch_size=8)
    buffer.extend(transitions(6))
    buffer.empty()
    before = buffer.sampler.state_dict()
    for _ in range(2):
        with pytest.raises(
            MisuseError, match=r"empty replay buffer; extend\(\) it with data first"
        ):
            buffer.sample()
    assert (len(buffer), buffer.write_count) == (0, 0)
    assert buffer.storage.log.snapshot() == (0, 0, 0)
    assert_same_state(buffer.sampler.state_dict(), before)
    buffer.extend(transitions(8, first=100))  # and the buffer works as before
    assert set(buffer.sample()["id"].tolist()) <= set(range(100, 108))


def assert_same_state(state: dict, expected: dict) -> None:
    assert state.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(state[key], value), key
        else:
            assert state[key] == value, key


def test_priority_updates_warn_without_a_prioritized_sampler() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(4))
    buffer.extend(torch.arange(2))
    with pytest.warns(UserWarning, match="use a PrioritizedSampler"):
        buffer.update_priority(torch.tensor([0]), 1.0)


def test_without_replacement_draws_each_item_once_per_epoch() -> None:
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(12),
        sampler=SamplerWithoutReplacement(),
        batch_size=5,
        generator=seeded(),
    )
    buffer.extend(torch.arange(12))
    for _ in range(3):
        batches = list(buffer)
        assert [len(batch) for batch in batches] == [5, 5, 2]
        assert sorted(torch.cat(batches).tolist()) == list(range(12))


def test_without_replacement_in_storage_order_follows_the_window() -> None:
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(6), sampler=SamplerWithoutReplacement(shuffle=False), batch_size=4
    )
    buffer.extend(torch.arange(9))  # slots hold 6 7 8 3 4 5
    assert torch.cat(list(buffer)).tolist() == [3, 4, 5, 6, 7, 8]


def test_without_replacement_drop_last() -> None:
    sampler = SamplerWithoutReplacement(drop_last=True)
    buffer = ReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler, batch_size=4)
    buffer.extend(torch.arange(10))
    assert [len(batch) for batch in buffer] == [4, 4]
    next(iter(buffer))  # halfway through an epoch
    before = sampler.state_dict()
    with pytest.raises(
        ValueError,
        match=r"batch_size=11 is larger than the 10 stored items.*use drop_last=False",
    ):
        buffer.sample(11)
    assert_same_state(sampler.state_dict(), before)
    assert (len(buffer), buffer.write_count) == (10, 10)
    assert torch.equal(buffer.sample(), before["order"][:4])  # the epoch goes on where it was
    with pytest.raises(ValueError, match="needs a fixed batch size"):
        ReplayBuffer(storage=LazyTensorStorage(4), sampler=SamplerWithoutReplacement(True))


def test_without_replacement_epochs_match_torchrl() -> None:
    torchrl_data = pytest.importorskip("torchrl.data")
    theirs = torchrl_data.ReplayBuffer(
        storage=torchrl_data.LazyTensorStorage(10),
        sampler=torchrl_data.SamplerWithoutReplacement(),
        batch_size=4,
    )
    ours = ReplayBuffer(
        storage=LazyTensorStorage(10), sampler=SamplerWithoutReplacement(), batch_size=4
    )
    for buffer in (theirs, ours):
        buffer.extend(torch.arange(10))
    assert [len(batch) for batch in ours] == [len(batch) for batch in theirs] == [4, 4, 2]


def test_batch_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        ReplayBuffer(storage=LazyTensorStorage(4), batch_size=0)
    buffer = ReplayBuffer(storage=LazyTensorStorage(4))
    buffer.extend(torch.arange(2))
    with pytest.raises(ValueError, match="sample\\(\\) needs a batch size"):
        buffer.sample()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"max_capacity": 0, "alpha": 1.0, "beta": 1.0}, "max_capacity must be a positive int"),
        ({"max_capacity": 4, "alpha": -1.0, "beta": 1.0}, "alpha must be a finite number >= 0"),
        ({"max_capacity": 4, "alpha": 1.0, "beta": float("nan")}, "beta must be a finite"),
    ],
)
def test_prioritized_sampler_arguments_are_checked(arguments: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PrioritizedSampler(**arguments)


SAMPLERS = {
    "random": lambda: RandomSampler(),
    "without_replacement": lambda: SamplerWithoutReplacement(),
    "prioritized": lambda: PrioritizedSampler(32, alpha=0.7, beta=0.5),
    "slice": lambda: SliceSampler(slice_len=4),
}


@pytest.mark.parametrize("name", SAMPLERS)
def test_sampler_contract(name: str) -> None:
    """Every sampler returns long slots inside the valid window, with per-item info."""
    storage = LazyTensorStorage(32)
    sampler = SAMPLERS[name]()
    buffer = ReplayBuffer(storage=storage, sampler=sampler, generator=seeded())
    for frames in (20, 25, 1):  # part full, then wrapped, then a window cut short
        buffer.extend(transitions(frames, first=buffer.write_count))
        if frames == 1:
            with storage.lock:  # what repairing a crashed 10-slot write leaves behind
                storage.log.begin(10)
                storage.log.recover(storage.max_size)
        cursor, length, write_count = storage.log.snapshot()
        valid_ids = set(range(write_count - length, write_count))
        for _ in range(20):
            with storage.lock:
                slots, info = sampler.sample(storage, 8)
            assert slots.dtype == torch.long
            assert slots.dim() == 1
            assert 0 < len(slots) <= 8  # an epoch's last batch may be smaller
            assert ((slots - (cursor - length)) % 32 < length).all(), "a slot outside the window"
            assert set(buffer[slots]["id"].tolist()) <= valid_ids
            assert all(len(value) == len(slots) for value in info.values())
    restored = SAMPLERS[name]()
    restored.load_state_dict(sampler.state_dict())

"""SliceSampler: slices stay inside one trajectory, have the asked length, and follow wraps."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rlcollect.errors import MisuseError
from rlcollect.replay import LazyTensorStorage, ListStorage, ReplayBuffer, SliceSampler


def episodes(lengths: list[int], first_id: int = 0, first_traj: int = 0) -> TensorDict:
    """Consecutive frames (ids from ``first_id``) split into trajectories of ``lengths``."""
    traj = torch.repeat_interleave(torch.arange(len(lengths)) + first_traj, torch.tensor(lengths))
    count = len(traj)
    ends = torch.zeros(count, dtype=torch.bool)
    ends[torch.tensor(lengths).cumsum(0) - 1] = True
    return TensorDict(
        {
            "id": torch.arange(first_id, first_id + count),
            "collector": {"traj_ids": traj},
            "next": {"done": ends.unsqueeze(-1), "terminated": ends.unsqueeze(-1)},
        },
        batch_size=[count],
    )


def check_slices(sample: TensorDict, slice_len: int) -> None:
    slices = sample.reshape(-1, slice_len)
    traj = slices["collector", "traj_ids"]
    assert (traj == traj[:, :1]).all(), "a slice mixes trajectories"
    assert (slices["id"].diff(dim=1) == 1).all(), "a slice skips or reorders steps"


def make_buffer(size: int, sampler: SliceSampler, seed: int = 0) -> ReplayBuffer:
    return ReplayBuffer(
        storage=LazyTensorStorage(size),
        sampler=sampler,
        generator=torch.Generator().manual_seed(seed),
    )


@pytest.mark.parametrize("key", ["traj_key", "end_key"])
def test_slices_stay_in_one_trajectory_with_the_asked_length(key: str) -> None:
    lengths = torch.randint(1, 30, (60,), generator=torch.Generator().manual_seed(3)).tolist()
    keys = (
        {"traj_key": ("collector", "traj_ids")}
        if key == "traj_key"
        else {"end_key": ("next", "done")}
    )
    buffer = make_buffer(2000, SliceSampler(slice_len=5, **keys))
    buffer.extend(episodes(lengths))
    for _ in range(20):
        sample = buffer.sample(200)
        assert sample.batch_size == torch.Size([200])
        check_slices(sample, 5)
    short = {traj for traj, length in enumerate(lengths) if length < 5}
    seen = set(buffer.sample(4000)["collector", "traj_ids"].tolist())
    assert not seen & short
    assert len(seen) > 0.9 * (len(lengths) - len(short))


def test_num_slices_sets_the_slice_length_from_the_batch() -> None:
    buffer = make_buffer(500, SliceSampler(num_slices=8))
    buffer.extend(episodes([40] * 10))
    sample = buffer.sample(64)
    check_slices(sample, 8)
    with pytest.raises(ValueError, match="batch_size=60 is not a multiple of num_slices=8"):
        buffer.sample(60)
    with pytest.raises(ValueError, match="use a multiple such as 12"):
        ReplayBuffer(storage=LazyTensorStorage(8), sampler=SliceSampler(slice_len=4), batch_size=10)


def test_trajectories_that_wrap_around_the_storage_stay_whole() -> None:
    buffer = make_buffer(50, SliceSampler(slice_len=6))
    buffer.extend(episodes([12] * 6))  # 72 frames: the window holds ids 22..71
    starts, lengths = buffer.sampler.trajectories(buffer.storage)
    assert starts.tolist() == [0, 2, 14, 26, 38]
    assert lengths.tolist() == [2, 12, 12, 12, 12]  # the oldest trajectory lost its head
    crossed = 0
    for _ in range(50):
        sample, info = buffer.sample(60, return_info=True)
        check_slices(sample, 6)
        slots = info["index"].reshape(-1, 6)
        crossed += int((slots.diff(dim=1) < 0).any(dim=1).sum())
    assert crossed > 0, "no slice crossed the end of the storage"


def test_newest_and_oldest_items_are_never_joined() -> None:
    buffer = make_buffer(10, SliceSampler(slice_len=4))
    buffer.extend(episodes([25]))  # one trajectory longer than the storage: ids 15..24 kept
    for _ in range(30):
        check_slices(buffer.sample(40), 4)


def test_end_of_slice_is_marked_truncated() -> None:
    buffer = make_buffer(100, SliceSampler(slice_len=5))
    buffer.extend(episodes([20, 20]))
    sample = buffer.sample(20).reshape(4, 5)
    truncated = sample["next", "truncated"].squeeze(-1)
    assert truncated[:, -1].all()
    assert not truncated[:, :-1].any()
    stored_done = (sample["id"] % 20 == 19).unsqueeze(-1)
    assert torch.equal(sample["next", "done"], stored_done | sample["next", "truncated"])
    assert torch.equal(sample["next", "terminated"], stored_done)


def test_short_trajectories() -> None:
    buffer = make_buffer(100, SliceSampler(slice_len=8))
    buffer.extend(episodes([3, 5, 4]))
    with pytest.raises(MisuseError, match="no stored trajectory has 8 steps"):
        buffer.sample(16)
    relaxed = make_buffer(100, SliceSampler(slice_len=8, strict_length=False))
    relaxed.extend(episodes([3, 5, 4]))
    sample = relaxed.sample(16)
    assert len(sample) < 16
    ends = sample["next", "truncated"].squeeze(-1).nonzero().squeeze(-1)
    for first, last in zip([-1, *ends[:-1].tolist()], ends.tolist(), strict=True):
        piece = sample[first + 1 : last + 1]
        assert (piece["collector", "traj_ids"] == piece["collector", "traj_ids"][0]).all()
        assert (piece["id"].diff() == 1).all()


def test_works_on_a_list_storage() -> None:
    buffer = ReplayBuffer(
        storage=ListStorage(100),
        sampler=SliceSampler(slice_len=3, traj_key=("collector", "traj_ids")),
    )
    buffer.extend(episodes([6, 6, 6]))
    check_slices(buffer.sample(12), 3)


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="exactly one of num_slices and slice_len"):
        SliceSampler(num_slices=2, slice_len=3)
    with pytest.raises(ValueError, match="exactly one of num_slices and slice_len"):
        SliceSampler()
    with pytest.raises(ValueError, match="must be a positive int"):
        SliceSampler(slice_len=0)
    with pytest.raises(ValueError, match="traj_key or end_key, not both"):
        SliceSampler(slice_len=2, traj_key="a", end_key="b")

"""Tests for split_trajectories and SplitTrajectories, checked against TorchRL's."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.collectors.utils import split_trajectories as torchrl_split_trajectories

from rlcollect.keys import MASK, TRAJ_IDS
from rlcollect.transforms.split import SplitTrajectories, split_trajectories


def make_batch(env_batch: list[int], time_steps: int, seed: int) -> TensorDict:
    """A collector-like batch with random episode ends and trajectory ids unique per env row."""
    generator = torch.Generator().manual_seed(seed)
    shape = [*env_batch, time_steps]
    done = torch.rand([*shape, 1], generator=generator) < 0.2
    starts = torch.zeros(shape, dtype=torch.long)
    starts[..., 1:] = done[..., :-1, 0].long()
    row = torch.arange(max(1, torch.Size(env_batch).numel())).reshape(env_batch or [1])
    traj_ids = starts.cumsum(-1) + 100 * row.reshape(*env_batch, 1) + 7
    batch = TensorDict(
        {
            "observation": torch.randn([*shape, 3], generator=generator),
            "action": torch.randint(0, 5, shape, generator=generator),
            "done": torch.zeros([*shape, 1], dtype=torch.bool),
            ("next", "observation"): torch.randn([*shape, 3], generator=generator),
            ("next", "reward"): torch.randn([*shape, 1], generator=generator),
            ("next", "done"): done,
            TRAJ_IDS: traj_ids.reshape(shape),
        },
        batch_size=shape,
    )
    batch.refine_names(..., "time")
    return batch


def assert_same_entries(ours: TensorDictBase, reference: TensorDictBase) -> None:
    assert ours.batch_size == reference.batch_size
    assert set(ours.keys(True, True)) == set(reference.keys(True, True))
    for key in reference.keys(True, True):
        assert ours.get(key).dtype == reference.get(key).dtype, key
        assert torch.equal(ours.get(key), reference.get(key)), key


@pytest.mark.parametrize(("env_batch", "seed"), [([], 0), ([], 1), ([4], 2), ([3], 3)])
def test_matches_torchrl_with_trajectory_ids(env_batch: list[int], seed: int) -> None:
    batch = make_batch(env_batch, 20, seed)
    ours = split_trajectories(batch)
    reference = torchrl_split_trajectories(batch, trajectory_key=TRAJ_IDS)
    assert_same_entries(ours, reference)
    assert ours.names == [None, "time"]
    assert ours.get(MASK).sum() == batch.numel()


@pytest.mark.parametrize("env_batch", [[], [4]])
def test_matches_torchrl_from_done_flags(env_batch: list[int]) -> None:
    batch = make_batch(env_batch, 16, seed=5).exclude(TRAJ_IDS)
    ours = split_trajectories(batch)
    # the empty "collector" entry left by exclude() makes TorchRL write under that prefix
    reference = torchrl_split_trajectories(batch, done_key="done")
    assert_same_entries(ours, reference)


@pytest.mark.parametrize("env_batch", [[], [3]])
def test_one_full_trajectory_per_row_matches_torchrl_names(env_batch: list[int]) -> None:
    batch = make_batch(env_batch, 6, seed=0)
    batch.set(TRAJ_IDS, torch.zeros(batch.shape, dtype=torch.long) + 9)
    if env_batch:
        batch.get(TRAJ_IDS)[1] = 10
        batch.get(TRAJ_IDS)[2] = 11
    ours = split_trajectories(batch)
    reference = torchrl_split_trajectories(batch, trajectory_key=TRAJ_IDS)
    assert_same_entries(ours, reference)
    assert ours.names == reference.names == [None, "time"]


def test_order_padding_and_mask_by_hand() -> None:
    batch = TensorDict(
        {
            "observation": torch.arange(1.0, 9.0).reshape(2, 4),
            TRAJ_IDS: torch.tensor([[5, 5, 6, 6], [2, 2, 2, 3]]),
        },
        batch_size=[2, 4],
    )
    split = split_trajectories(batch)
    assert split["observation"].tolist() == [[1, 2, 0], [3, 4, 0], [5, 6, 7], [8, 0, 0]]
    assert split[TRAJ_IDS].tolist() == [[5, 5, 0], [6, 6, 0], [2, 2, 2], [3, 0, 0]]
    assert split[MASK].tolist() == [
        [True, True, False],
        [True, True, False],
        [True, True, True],
        [True, False, False],
    ]


def test_input_is_not_modified() -> None:
    batch = make_batch([], 10, seed=2).exclude(TRAJ_IDS)
    before = batch.clone()
    split_trajectories(batch)
    assert set(batch.keys(True, True)) == set(before.keys(True, True))
    assert (batch == before).all()


def test_callable_matches_function() -> None:
    batch = make_batch([2], 12, seed=4)
    post_processor = SplitTrajectories()
    assert_same_entries(post_processor(batch), split_trajectories(batch))
    assert "traj_ids" in repr(post_processor)


def test_bad_key_is_rejected_at_construction() -> None:
    with pytest.raises(TypeError, match="trajectory_key must be a key"):
        SplitTrajectories(trajectory_key=3)  # type: ignore[arg-type]


def test_empty_batch_is_rejected() -> None:
    with pytest.raises(ValueError, match="with T > 0"):
        split_trajectories(TensorDict({}, batch_size=[]))


def test_env_rows_never_share_a_trajectory() -> None:
    # the same id in two env rows is two trajectories (TorchRL would merge them into one)
    batch = TensorDict(
        {
            "observation": torch.arange(4.0).reshape(2, 2),
            TRAJ_IDS: torch.ones(2, 2, dtype=torch.long),
        },
        batch_size=[2, 2],
    )
    split = split_trajectories(batch)
    assert split["observation"].tolist() == [[0, 1], [2, 3]]
    assert split[MASK].all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    batch = make_batch([3], 12, seed=6)
    on_cuda = split_trajectories(batch.to("cuda"))
    assert on_cuda.get(MASK).is_cuda
    assert_same_entries(on_cuda.cpu(), split_trajectories(batch))

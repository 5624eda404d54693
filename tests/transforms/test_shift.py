"""Tests for ShiftedView on hand-made batches and against a brute-force loop."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rlcollect.keys import MASK, TRAJ_IDS
from rlcollect.transforms.shift import ShiftedView


def flags(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.bool).unsqueeze(-1)


def hand_batch() -> TensorDict:
    """Steps 1..7 of a single env; an episode ends at step 3 (done), another at step 5 (new id)."""
    batch = TensorDict(
        {
            "action": torch.arange(1, 8),
            "observation": torch.arange(1.0, 8.0).unsqueeze(-1).expand(7, 2).clone(),
            ("next", "reward"): torch.arange(10.0, 80.0, 10.0).unsqueeze(-1),
            ("next", "done"): flags(0, 0, 1, 0, 0, 0, 0),
            TRAJ_IDS: torch.tensor([4, 4, 4, 5, 5, 9, 9]),
        },
        batch_size=[7],
    )
    batch.refine_names("time")
    return batch


def test_previous_action_is_zero_at_episode_start() -> None:
    out = ShiftedView("action", -1)(hand_batch())
    assert out["prev_action"].tolist() == [0, 1, 2, 0, 4, 0, 6]


def test_next_action_is_zero_at_episode_and_batch_end() -> None:
    out = ShiftedView("action", 1)(hand_batch())
    assert out["next_action"].tolist() == [2, 3, 0, 5, 0, 7, 0]


def test_done_flags_alone_mark_boundaries() -> None:
    out = ShiftedView("action", -1)(hand_batch().exclude(TRAJ_IDS))
    assert out["prev_action"].tolist() == [0, 1, 2, 0, 4, 5, 6]


def test_trajectory_ids_alone_mark_boundaries() -> None:
    out = ShiftedView("action", -1)(hand_batch().exclude(("next", "done")))
    assert out["prev_action"].tolist() == [0, 1, 2, 0, 4, 0, 6]


def test_range_stacks_offsets_after_time() -> None:
    out = ShiftedView("observation", "-2:0", out_key="frames")(hand_batch())
    assert out["frames"].shape == (7, 3, 2)
    assert out["frames"][..., 0].tolist() == [
        [0, 0, 1],
        [0, 1, 2],
        [1, 2, 3],
        [0, 0, 4],
        [0, 4, 5],
        [0, 0, 6],
        [0, 6, 7],
    ]


def test_list_keeps_the_given_order() -> None:
    out = ShiftedView("action", [1, -1], out_key="around")(hand_batch())
    assert out["around"].tolist() == [[2, 0], [3, 1], [0, 2], [5, 0], [0, 4], [7, 0], [0, 6]]


def test_nested_key_gets_a_nested_default_name() -> None:
    out = ShiftedView(("next", "reward"), -1)(hand_batch())
    assert out["next", "prev_reward"].squeeze(-1).tolist() == [0, 10, 20, 0, 40, 0, 60]


def test_sub_tensordict_is_shifted_leaf_by_leaf() -> None:
    batch = hand_batch()
    batch["pixels"] = TensorDict(
        {"left": batch["action"], "right": -batch["action"]}, batch_size=[7]
    )
    out = ShiftedView("pixels", "-1:-1", out_key="prev_pixels")(batch)
    assert out["prev_pixels"].batch_size == (7, 1)
    assert out["prev_pixels", "right"].squeeze(-1).tolist() == [0, -1, -2, 0, -4, 0, -6]


def test_env_rows_do_not_leak_into_each_other() -> None:
    batch = TensorDict(
        {
            "action": torch.tensor([[1, 2, 3], [4, 5, 6]]),
            ("next", "done"): torch.zeros(2, 3, 1, dtype=torch.bool),
            TRAJ_IDS: torch.tensor([[0, 0, 0], [0, 0, 0]]),
        },
        batch_size=[2, 3],
    )
    assert ShiftedView("action", -1)(batch)["prev_action"].tolist() == [[0, 1, 2], [0, 4, 5]]
    assert ShiftedView("action", 1)(batch)["next_action"].tolist() == [[2, 3, 0], [5, 6, 0]]


def test_split_batch_never_reads_padding() -> None:
    batch = TensorDict(
        {
            "action": torch.tensor([[1, 2, 0], [3, 4, 5]]),
            ("next", "done"): torch.zeros(2, 3, 1, dtype=torch.bool),
            TRAJ_IDS: torch.tensor([[0, 0, 0], [1, 1, 1]]),
            MASK: torch.tensor([[True, True, False], [True, True, True]]),
        },
        batch_size=[2, 3],
    )
    batch["action"][0, 2] = 99  # garbage in the padding must not show
    assert ShiftedView("action", 1)(batch)["next_action"].tolist() == [[2, 0, 0], [4, 5, 0]]
    assert ShiftedView("action", -1)(batch)["prev_action"].tolist() == [[0, 1, 0], [0, 3, 4]]


@pytest.mark.parametrize("shift", [-3, 2, "-4:1", [-1, 3, 0]])
def test_matches_brute_force_on_random_batches(shift: object) -> None:
    generator = torch.Generator().manual_seed(0)
    done = torch.rand(3, 2, 17, 1, generator=generator) < 0.2
    batch = TensorDict(
        {"observation": torch.randn(3, 2, 17, 4, generator=generator), ("next", "done"): done},
        batch_size=[3, 2, 17],
    )
    view = ShiftedView("observation", shift, out_key="view")
    out = view(batch)["view"]
    if isinstance(shift, int):
        out = out.unsqueeze(-2)
    for row, (observations, row_done) in enumerate(
        zip(batch["observation"].reshape(6, 17, 4), done.reshape(6, 17).tolist(), strict=True)
    ):
        episode = [sum(row_done[:t]) for t in range(17)]
        for t in range(17):
            for k, offset in enumerate(view.offsets):
                source = t + offset
                inside = 0 <= source < 17 and episode[source] == episode[t]
                expected = observations[source] if inside else torch.zeros(4)
                assert torch.equal(out.reshape(6, 17, -1, 4)[row, t, k], expected), (row, t, offset)


def test_input_is_not_modified() -> None:
    batch = hand_batch()
    ShiftedView("action", -1)(batch)
    assert batch.get("prev_action", None) is None


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        (("action", "-1"), ValueError, 'must read "start:stop"'),
        (("action", "-1:x"), ValueError, 'must read "start:stop" with two ints'),
        (("action", "2:1"), ValueError, "start <= stop"),
        (("action", []), TypeError, "non-empty list of ints"),
        (("action", [1.0]), TypeError, "non-empty list of ints"),
        (("action", True), TypeError, "shift must be an int"),
        (("action", -2), ValueError, "out_key is needed for a shift other than -1 or"),
        (("action", [-1]), ValueError, "out_key is needed"),
        ((7, -1), TypeError, "key must be a key"),
    ],
)
def test_bad_arguments_are_rejected_at_construction(
    arguments: tuple, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        ShiftedView(*arguments)


def test_batch_without_boundaries_is_reported() -> None:
    batch = TensorDict({"action": torch.arange(3)}, batch_size=[3])
    with pytest.raises(KeyError, match="needs"):
        ShiftedView("action", -1)(batch)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    batch = hand_batch()
    batch[MASK] = torch.ones(7, dtype=torch.bool)
    view = ShiftedView("observation", "-2:1", out_key="window")
    on_cuda = view(batch.to("cuda"))["window"]
    assert torch.equal(on_cuda.cpu(), view(batch)["window"])

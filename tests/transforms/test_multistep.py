"""Tests for MultiStep, checked against TorchRL's MultiStep and by hand."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data.postprocs import MultiStep as TorchRLMultiStep

from rlcollect.keys import MASK, TRAJ_IDS
from rlcollect.transforms.multistep import MultiStep


def make_batch(env_batch: list[int], time_steps: int, seed: int) -> TensorDict:
    """A batch with random episode ends; step counts let a test see which step was taken."""
    generator = torch.Generator().manual_seed(seed)
    shape = [*env_batch, time_steps]
    terminated = torch.rand([*shape, 1], generator=generator) < 0.15
    truncated = (torch.rand([*shape, 1], generator=generator) < 0.1) & ~terminated
    batch = TensorDict(
        {
            "observation": torch.randn([*shape, 3], generator=generator),
            "action": torch.randn([*shape, 2], generator=generator),
            "done": torch.zeros([*shape, 1], dtype=torch.bool),
            ("next", "observation"): torch.randn([*shape, 3], generator=generator),
            ("next", "step_count"): torch.arange(1, time_steps + 1)
            .expand(shape)
            .unsqueeze(-1)
            .clone(),
            ("next", "reward"): torch.randn([*shape, 1], generator=generator),
            ("next", "terminated"): terminated,
            ("next", "truncated"): truncated,
            ("next", "done"): terminated | truncated,
            TRAJ_IDS: torch.zeros(shape, dtype=torch.long),
        },
        batch_size=shape,
    )
    batch.refine_names(..., "time")
    return batch


def assert_same_entries(ours: TensorDictBase, reference: TensorDictBase) -> None:
    assert set(ours.keys(True, True)) == set(reference.keys(True, True))
    for key in reference.keys(True, True):
        assert ours.get(key).dtype == reference.get(key).dtype, key
        torch.testing.assert_close(
            ours.get(key), reference.get(key), rtol=1e-6, atol=1e-6, msg=str(key)
        )


@pytest.mark.parametrize("env_batch", [[], [4], [2, 3]])
@pytest.mark.parametrize("n_steps", [2, 3, 5])
def test_matches_torchrl(env_batch: list[int], n_steps: int) -> None:
    batch = make_batch(env_batch, 24, seed=n_steps)
    assert batch["next", "done"].any()
    ours = MultiStep(0.9, n_steps)(batch)
    reference = TorchRLMultiStep(0.9, n_steps)(batch.clone())
    assert_same_entries(ours, reference)
    assert ours.batch_size == batch.batch_size
    assert ours.names == batch.names


def test_one_step_keeps_transitions() -> None:
    batch = make_batch([3], 10, seed=0)
    out = MultiStep(0.9, 1)(batch)
    reference = TorchRLMultiStep(0.9, 1)(batch.clone())
    assert_same_entries(out.exclude("nonterminal"), reference.exclude("nonterminal"))
    assert torch.equal(out["next", "reward"], batch["next", "reward"])
    assert torch.equal(out["next", "observation"], batch["next", "observation"])
    assert (out["steps_to_next_obs"] == 1).all()


def test_windows_by_hand() -> None:
    done = torch.tensor([0, 0, 0, 1, 0, 0, 0], dtype=torch.bool).unsqueeze(-1)
    batch = TensorDict(
        {
            ("next", "reward"): torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]).unsqueeze(-1),
            ("next", "done"): done,
            ("next", "terminated"): done.clone(),
            ("next", "observation"): torch.arange(1.0, 8.0).unsqueeze(-1),
        },
        batch_size=[7],
    )
    out = MultiStep(0.5, 3)(batch)
    assert out["steps_to_next_obs"].tolist() == [3, 3, 2, 1, 3, 2, 1]
    assert out["next", "observation"].squeeze(-1).tolist() == [3, 4, 4, 4, 7, 7, 7]
    expected_reward = [1 + 1 + 0.75, 2 + 1.5 + 1, 3 + 2, 4, 5 + 3 + 1.75, 6 + 3.5, 7]
    assert out["next", "reward"].squeeze(-1).tolist() == expected_reward
    assert out["gamma"].tolist() == [0.125, 0.125, 0.25, 0.5, 0.125, 0.25, 0.5]
    assert out["nonterminal"].tolist() == [True, True, True, False, True, True, False]
    assert torch.equal(out["next", "done"], done)
    assert torch.equal(out["next", "original_reward"], batch["next", "reward"])
    assert batch.get(("next", "original_reward"), None) is None


def test_split_batch_windows_stop_before_padding() -> None:
    batch = make_batch([2], 6, seed=1)
    batch["next", "done"] = torch.zeros(2, 6, 1, dtype=torch.bool)
    batch[MASK] = torch.tensor([[True] * 4 + [False] * 2, [True] * 6])
    out = MultiStep(0.9, 3)(batch)
    assert out["steps_to_next_obs"].tolist() == [[3, 3, 2, 1, 1, 1], [3, 3, 3, 3, 2, 1]]
    assert out["nonterminal"].tolist() == [
        [True, True, True, False, False, False],
        [True] * 5 + [False],
    ]
    unpadded = MultiStep(0.9, 3)(batch[0, :4].exclude(MASK))
    for key in [("next", "reward"), ("next", "observation"), "gamma"]:
        torch.testing.assert_close(out[key][0, :4], unpadded[key])
    # where the trajectories are complete, TorchRL agrees
    assert_same_entries(out[1], TorchRLMultiStep(0.9, 3)(batch.clone())[1])


def test_flags_of_wrong_shape_are_reported() -> None:
    batch = make_batch([], 5, seed=0)
    batch["next"].set("done", torch.zeros(5, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"one \('next', 'done'\) flag per step"):
        MultiStep(0.9, 2)(batch)


@pytest.mark.parametrize(
    ("gamma", "n_steps", "error", "message"),
    [
        (1.2, 3, ValueError, r"gamma must be in \[0, 1\], got gamma=1.2"),
        (-0.5, 3, ValueError, r"gamma must be in \[0, 1\]"),
        ("0.9", 3, TypeError, "gamma must be a number"),
        (0.9, 0, ValueError, "n_steps must be >= 1, got n_steps=0"),
        (0.9, 2.0, TypeError, "n_steps must be an int"),
    ],
)
def test_bad_arguments_are_rejected(
    gamma: object, n_steps: object, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        MultiStep(gamma, n_steps)  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    batch = make_batch([3], 12, seed=6)
    batch[MASK] = torch.ones(3, 12, dtype=torch.bool)
    assert_same_entries(MultiStep(0.9, 3)(batch.to("cuda")).cpu(), MultiStep(0.9, 3)(batch))

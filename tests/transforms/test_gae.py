"""Tests for GAE, against a hand-written double loop and against TorchRL's GAE."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.objectives.value import GAE as TorchRLGAE  # noqa: N811
from torchrl.objectives.value.functional import generalized_advantage_estimate

from rlcollect.keys import MASK
from rlcollect.transforms.gae import GAE


def make_batch(
    env_batch: list[int], time_steps: int, seed: int, dtype: torch.dtype = torch.float32
) -> TensorDict:
    """A batch with random terminations and truncations; the last step is often not done."""
    generator = torch.Generator().manual_seed(seed)
    shape = [*env_batch, time_steps]
    terminated = torch.rand([*shape, 1], generator=generator) < 0.15
    truncated = (torch.rand([*shape, 1], generator=generator) < 0.1) & ~terminated
    batch = TensorDict(
        {
            "observation": torch.randn([*shape, 3], generator=generator, dtype=dtype),
            ("next", "observation"): torch.randn([*shape, 3], generator=generator, dtype=dtype),
            ("next", "reward"): torch.randn([*shape, 1], generator=generator, dtype=dtype),
            ("next", "terminated"): terminated,
            ("next", "truncated"): truncated,
            ("next", "done"): terminated | truncated,
        },
        batch_size=shape,
    )
    batch.refine_names(..., "time")
    return batch


def make_value_net(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(
        dtype
    )


def reference_gae(
    batch: TensorDict, net: torch.nn.Module, gamma: float, lmbda: float
) -> list[list[float]]:
    """Pure Python double loop over env rows and reversed time."""
    rows = batch.reshape(-1, batch.shape[-1])
    advantages = []
    with torch.no_grad():
        for row in rows.unbind(0):
            value = net(row["observation"]).squeeze(-1).tolist()
            next_value = net(row["next", "observation"]).squeeze(-1).tolist()
            reward = row["next", "reward"].squeeze(-1).tolist()
            done = row["next", "done"].squeeze(-1).tolist()
            terminated = row["next", "terminated"].squeeze(-1).tolist()
            row_advantage = [0.0] * len(reward)
            following = 0.0
            for t in reversed(range(len(reward))):
                delta = reward[t] + gamma * next_value[t] * (not terminated[t]) - value[t]
                following = delta + gamma * lmbda * (not done[t]) * following
                row_advantage[t] = following
            advantages.append(row_advantage)
    return advantages


@pytest.mark.parametrize("env_batch", [[], [5], [2, 3]])
@pytest.mark.parametrize("wrap", [True, False])
def test_matches_reference_loop(env_batch: list[int], wrap: bool) -> None:
    batch = make_batch(env_batch, 25, seed=1, dtype=torch.float64)
    net = make_value_net(torch.float64)
    value_network = TensorDictModule(net, ["observation"], ["state_value"]) if wrap else net
    out = GAE(0.97, 0.9, value_network)(batch)
    expected = torch.tensor(reference_gae(batch, net, 0.97, 0.9), dtype=torch.float64)
    advantage = out["advantage"].reshape(-1, batch.shape[-1])
    torch.testing.assert_close(advantage, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(out["value_target"], out["advantage"] + out["state_value"])
    assert out["advantage"].shape == batch["next", "reward"].shape


def test_truncation_bootstraps_and_termination_does_not() -> None:
    batch = make_batch([], 3, seed=0)
    batch["next", "reward"] = torch.zeros(3, 1)
    batch["next", "terminated"] = torch.tensor([[False], [True], [False]])
    batch["next", "truncated"] = torch.tensor([[True], [False], [False]])
    batch["next", "done"] = torch.tensor([[True], [True], [False]])
    net = make_value_net()
    out = GAE(0.5, 1.0, net)(batch)
    value, next_value = out["state_value"], out["next", "state_value"]
    torch.testing.assert_close(out["advantage"][0], 0.5 * next_value[0] - value[0])
    torch.testing.assert_close(out["advantage"][1], -value[1])
    torch.testing.assert_close(out["advantage"][2], 0.5 * next_value[2] - value[2])


@pytest.mark.parametrize("env_batch", [[], [4]])
@pytest.mark.parametrize("average_gae", [False, True])
def test_matches_torchrl_gae(env_batch: list[int], average_gae: bool) -> None:
    batch = make_batch(env_batch, 30, seed=2)
    value_network = TensorDictModule(make_value_net(), ["observation"], ["state_value"])
    ours = GAE(0.99, 0.95, value_network, average_gae=average_gae)(batch)
    reference = TorchRLGAE(
        gamma=0.99, lmbda=0.95, value_network=value_network, average_gae=average_gae
    )(batch.clone())
    for key in ["advantage", "value_target", "state_value", ("next", "state_value")]:
        torch.testing.assert_close(ours[key], reference[key], rtol=1e-6, atol=1e-6)


def test_matches_torchrl_functional() -> None:
    batch = make_batch([3], 40, seed=3)
    out = GAE(0.9, 0.8, make_value_net())(batch)
    advantage, value_target = generalized_advantage_estimate(
        0.9,
        0.8,
        out["state_value"],
        out["next", "state_value"],
        batch["next", "reward"],
        batch["next", "done"],
        batch["next", "terminated"],
        time_dim=-2,
    )
    torch.testing.assert_close(out["advantage"], advantage, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out["value_target"], value_target, rtol=1e-6, atol=1e-6)


def test_value_network_runs_once_without_grad() -> None:
    net = make_value_net()
    calls = []
    net.register_forward_hook(
        lambda module, args, output: calls.append((args[0].shape, output.requires_grad))
    )
    GAE(0.9, 0.9, net)(make_batch([4], 7, seed=0))
    assert calls == [(torch.Size([2 * 4 * 7, 3]), False)]


def test_input_is_not_modified_and_missing_terminated_defaults_to_done() -> None:
    batch = make_batch([2], 6, seed=4)
    without_terminated = batch.exclude(("next", "terminated"))
    out = GAE(0.9, 0.9, make_value_net())(without_terminated)
    assert without_terminated.get("advantage", None) is None
    expected = generalized_advantage_estimate(
        0.9,
        0.9,
        out["state_value"],
        out["next", "state_value"],
        batch["next", "reward"],
        batch["next", "done"],
    )[0]
    torch.testing.assert_close(out["advantage"], expected)


def test_split_batch_stops_at_padding_and_averages_real_steps() -> None:
    batch = make_batch([2], 5, seed=5)
    batch["next", "done"] = torch.zeros(2, 5, 1, dtype=torch.bool)
    batch["next", "terminated"] = torch.zeros(2, 5, 1, dtype=torch.bool)
    mask = torch.tensor([[True, True, True, False, False], [True] * 5])
    batch[MASK] = mask
    net = make_value_net()
    out = GAE(0.9, 0.9, net)(batch)
    unpadded = GAE(0.9, 0.9, net)(batch[0, :3].exclude(MASK))
    torch.testing.assert_close(out["advantage"][0, :3], unpadded["advantage"])
    averaged = GAE(0.9, 0.9, net, average_gae=True)(batch)["advantage"][mask]
    torch.testing.assert_close(averaged.mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(averaged.std(), torch.tensor(1.0))


def test_value_shape_mismatch_is_reported() -> None:
    with pytest.raises(ValueError, match="one value per reward"):
        GAE(0.9, 0.9, torch.nn.Linear(3, 2))(make_batch([], 4, seed=0))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"gamma": 1.5}, ValueError, r"gamma must be in \[0, 1\], got gamma=1.5"),
        ({"lmbda": -0.1}, ValueError, r"lmbda must be in \[0, 1\]"),
        ({"gamma": True}, TypeError, "gamma must be a number"),
        ({"value_network": lambda x: x}, TypeError, "value_network must be a TensorDictModule"),
        (
            {"value_network": TensorDictModule(torch.nn.Identity(), ["observation"], ["a", "b"])},
            TypeError,
            "must write one value entry",
        ),
    ],
)
def test_bad_arguments_are_rejected_at_construction(
    kwargs: dict, error: type, message: str
) -> None:
    arguments = {"gamma": 0.99, "lmbda": 0.95, "value_network": torch.nn.Linear(3, 1), **kwargs}
    with pytest.raises(error, match=message):
        GAE(**arguments)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    batch = make_batch([3], 12, seed=6)
    batch["collector", "mask"] = torch.ones(3, 12, dtype=torch.bool)
    net = make_value_net()
    expected = GAE(0.9, 0.9, net)(batch)["advantage"]
    advantage = GAE(0.9, 0.9, net.to("cuda"))(batch.to("cuda"))["advantage"]
    torch.testing.assert_close(advantage.cpu(), expected, rtol=1e-5, atol=1e-5)


def test_values_already_in_the_batch_match_torchrl_without_a_network() -> None:
    batch = make_batch([3], 20, seed=4)
    net = TensorDictModule(make_value_net(), ["observation"], ["state_value"])
    with torch.no_grad():
        net(batch)
        net(batch["next"])
    ours = GAE(0.99, 0.95, None)(batch)
    reference = TorchRLGAE(gamma=0.99, lmbda=0.95, value_network=None)(batch.clone())
    for key in ["advantage", "value_target"]:
        torch.testing.assert_close(ours[key], reference[key], rtol=1e-6, atol=1e-6)
    with pytest.raises(KeyError, match=r"lacks \[\('next', 'state_value'\)\]"):
        GAE(0.99, 0.95, None)(batch.exclude(("next", "state_value")))

"""TorchRL's `sota-implementations` with our Collector: each script's collector arguments (its
default config), TorchRL's env, loss and replay buffer, two batches and a few updates each."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

pytest.importorskip("torchrl.objectives")

from rlcollect import Collector
from tests.torchrl_scripts.builders import MUJOCO, SCRIPTS, flat, total_loss

# Two batches: the first of random actions for the off-policy scripts (init_random_frames),
# the second of the policy trained on the first.
BATCHES = 2
UPDATES = 3  # gradient steps per batch
# What every one of these losses reads from a transition (and the value estimators from "next").
LOSS_READS = {
    "observation",
    "action",
    ("next", "observation"),
    ("next", "reward"),
    ("next", "done"),
    ("next", "terminated"),
}


def parameters(module: torch.nn.Module) -> TensorDictBase:
    return TensorDict.from_module(module).detach().clone()


def same(first: TensorDictBase, second: TensorDictBase) -> bool:
    names = set(first.keys(True, True))
    return names == set(second.keys(True, True)) and all(
        torch.equal(first.get(key), second.get(key)) for key in names
    )


def holds(model: torch.nn.Module, trained: torch.nn.Module) -> bool:
    """Whether every parameter of `trained` is, value for value, one of `model`'s (the
    collector's policy may wrap the trained actor in an exploration module)."""
    held = [parameter.detach() for parameter in model.parameters()]
    return all(
        any(p.shape == h.shape and torch.equal(p.detach(), h) for h in held)
        for p in trained.parameters()
    )


def train_on(parts: dict[str, Any], batch: TensorDictBase, optimizer: Any) -> list[float]:
    """A few updates on `batch` as the script does: GAE then minibatches of the batch
    (on-policy), or extend the replay buffer and sample it (off-policy)."""
    buffer, loss_module = parts["buffer"], parts["loss"]
    if parts["on_policy"]:
        with torch.no_grad():
            parts["advantage"](batch)
        buffer.empty()
    buffer.extend(flat(batch))
    losses = []
    for _ in range(UPDATES):
        sample = buffer.sample()
        loss = total_loss(loss_module(sample))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if "updater" in parts:
            parts["updater"].step()
    return losses


def check_batch(parts: dict[str, Any], batch: TensorDictBase, collector: Any) -> None:
    """The batch TorchRL's loss needs: every key it reads, frames_per_batch frames, and for
    the on-policy scripts the log-probability of the action under the collecting policy."""
    env_batch = collector.env.batch_size.numel() if collector.env.batch_size else 1
    expected = math.ceil(parts["collector"]["frames_per_batch"] / env_batch) * env_batch
    assert batch.numel() == expected
    present = set(batch.keys(include_nested=True, leaves_only=True))
    assert present >= LOSS_READS, LOSS_READS - present
    if parts["on_policy"]:
        with torch.no_grad():
            distribution = parts["policy"].get_dist(batch.clone())
            log_prob = distribution.log_prob(batch["action"])
        logged = batch.get(parts["loss"].tensor_keys.sample_log_prob)
        torch.testing.assert_close(logged.reshape(log_prob.shape), log_prob, rtol=1e-3, atol=1e-3)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("script", list(SCRIPTS))
def test_sota_script_trains_with_our_collector(script: str) -> None:
    if script in MUJOCO:
        pytest.importorskip("mujoco")
    torch.manual_seed(0)
    parts = SCRIPTS[script]()
    collector = Collector(**parts["collector"])
    if "seed" in parts:
        collector.set_seed(parts["seed"])
    optimizer = torch.optim.Adam(parts["loss"].parameters(), lr=1e-3)
    before = parameters(parts["policy"])
    losses: list[float] = []
    for index, batch in enumerate(collector):
        check_batch(parts, batch, collector)
        if "after_batch" in parts:
            parts["after_batch"](batch)
        losses += train_on(parts, batch, optimizer)
        collector.update_policy_weights_()
        if index + 1 == BATCHES:
            break
    # --- what the run shows -----------------------------------------------------------------
    assert collector.frames == (index + 1) * batch.numel()
    assert all(math.isfinite(value) for value in losses)
    after = parameters(parts["policy"])
    assert not same(after, before), "no policy parameter changed"
    # The weights the collector acts with are the trained ones.
    assert holds(collector.get_model("policy"), parts["policy"])
    collector.shutdown()

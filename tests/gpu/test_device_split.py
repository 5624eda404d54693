"""The env on the CPU, the policy and the batches on CUDA: the same batches as a CPU run, and
no synchronization per step beyond reading the policy's outputs back for the env.

Where the data goes (`collectors/policy/steps.py`, `collectors/carrier.py`): the carrier lives
on the env's device, so each step copies the policy's inputs to CUDA with `non_blocking=True`
(no sync) and copies each output back into the carrier with a blocking `copy_` (one sync per
output key: the env needs the action on the CPU before it can step). Each batch goes to the
storing device with `TensorDict.to`, whose copies to CUDA are non-blocking (no sync). So a
policy that writes only the action costs one synchronization per step, and nothing per batch.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from tensordict import TensorDictBase

from rlcollect import Collector
from rlcollect.envs import GymEnv
from rlcollect.testing import CountingEnv
from tests.gpu.helpers import (
    DEVICES,
    SYNC_WARNING,
    counting_actor_critic,
    counting_syncs,
    differing_entries,
    needs_cuda,
    pole_angle_module,
)
from tests.gpu.process_report import CUDA_ENTRY_POINTS

pytestmark = pytest.mark.timeout(120)
FRAMES, BATCHES = 50, 10


def cartpole_batches(device: str, batches: int = 4) -> list[TensorDictBase]:
    """`batches` batches of a seeded CartPole on the CPU, the policy and the storage on
    `device`; every batch kept until the end, so a batch that still shared memory with the
    carrier (overwritten by the next batch) would show."""
    env = GymEnv("CartPole-v1")
    env.set_seed(5)
    collector = Collector(
        env,
        pole_angle_module(),
        frames_per_batch=FRAMES,
        total_frames=FRAMES * batches,
        env_device="cpu",
        policy_device=device,
        storing_device=device,
    )
    try:
        return list(collector)
    finally:
        collector.shutdown()


@pytest.mark.parametrize("device", DEVICES)
def test_batches_equal_a_cpu_run_with_the_same_seed(device: str) -> None:
    ours, reference = cartpole_batches(device), cartpole_batches("cpu")
    assert len(ours) == len(reference) == 4
    for index, (batch, expected) in enumerate(zip(ours, reference, strict=True)):
        assert batch.device.type == device, index
        leaves = batch.values(include_nested=True, leaves_only=True)
        assert all(leaf.device.type == device for leaf in leaves), index
        assert batch.batch_size == expected.batch_size
        assert not differing_entries(batch, expected), (index, differing_entries(batch, expected))
    actions = torch.cat([batch["action"].cpu() for batch in ours])
    assert 0 < actions[:, 1].sum() < len(actions), "the policy pushed both ways"


# --- the sync counter, calibrated ----------------------------------------------------------------


def test_the_counter_counts_every_sync_warning_and_nothing_else() -> None:
    """The counter's own logic, on any machine: every warning with sync debug mode's text
    counts, from the same line too (no once-per-location filter), and other warnings do not."""
    with counting_syncs() as syncs:
        for _ in range(3):
            warnings.warn(SYNC_WARNING, UserWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)
    assert syncs.count == 3


@pytest.mark.gpu
@needs_cuda
def test_the_counter_sees_real_cuda_syncs_and_not_asynchronous_copies() -> None:
    ones = torch.ones(3, device="cuda")
    with counting_syncs() as syncs:
        for _ in range(3):
            ones.sum().item()  # a scalar read back: a sync each
        ones.cpu()  # a blocking copy to the host: one more
        torch.ones(3).to("cuda", non_blocking=True)  # enqueued: none
        ones * 2  # a kernel: none
    assert syncs.count == 4


# --- syncs per step -------------------------------------------------------------------------------


def count_syncs(collector: Collector, batches: int) -> int:
    """Synchronizations over `batches` batches, after a first batch (warm-up) not counted."""
    iterator = iter(collector)
    next(iterator)
    with counting_syncs() as syncs:
        for _ in range(batches):
            next(iterator)
    return syncs.count


@pytest.mark.parametrize("device", DEVICES)
def test_one_sync_per_step_reads_the_action_back_and_batches_cost_none(device: str) -> None:
    env = GymEnv("CartPole-v1")
    env.set_seed(1)
    collector = Collector(
        env,
        pole_angle_module(),
        frames_per_batch=FRAMES,
        policy_device=device,
        storing_device=device,
    )
    try:
        count = count_syncs(collector, BATCHES)
    finally:
        collector.shutdown()
    steps = FRAMES * BATCHES
    if device == "cpu":
        assert count == 0
    else:
        # The action read back at every step is needed; anything per batch is allowed once.
        assert steps <= count <= steps + BATCHES, count


@pytest.mark.parametrize("device", DEVICES)
def test_each_output_read_back_is_one_sync_and_nothing_else(device: str) -> None:
    """An actor-critic writes three outputs (action, log-prob, value): three blocking copies
    to the CPU carrier per step, on a batched env of 4 (non-contiguous slots) too."""
    env = CountingEnv(episode_length=7, batch_size=(4,))
    collector = Collector(
        env,
        counting_actor_critic(),
        frames_per_batch=4 * FRAMES,
        policy_device=device,
        storing_device=device,
    )
    try:
        count = count_syncs(collector, BATCHES)
    finally:
        collector.shutdown()
    steps, outputs = FRAMES * BATCHES, 3
    if device == "cpu":
        assert count == 0
    else:
        assert steps * outputs <= count <= steps * outputs + BATCHES, count


# --- the CPU side alone ---------------------------------------------------------------------------


def test_a_cpu_collector_makes_no_cuda_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Built and run on the CPU, a collector calls none of torch.cuda's entry points: a worker
    forked from a parent that uses CUDA may run it (tests/gpu/test_multiprocess_cuda.py)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a CPU collector called torch.cuda")

    for name in CUDA_ENTRY_POINTS:
        monkeypatch.setattr(torch.cuda, name, refuse)
    for options in ({}, {"device": "cpu"}, {"policy_device": "cpu", "storing_device": "cpu"}):
        env = CountingEnv(episode_length=7, batch_size=(4,))
        collector = Collector(
            env, counting_actor_critic(), frames_per_batch=40, total_frames=120, **options
        )
        try:
            assert len(list(collector)) == 3
        finally:
            collector.shutdown()

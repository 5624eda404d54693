"""`collect()` into a `RolloutBuffer` on the GPU, the env on the CPU: the rollout a CUDA
policy fills equals the one a CPU run fills, bootstrap value included, rollout after rollout,
and its minibatches come out on the GPU.

The env counts steps (`CountingEnv`) and the actor-critic is a known, exact function of the
observation, so every field of every slot is predictable on either device.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDictBase

from rlcollect import Collector
from rlcollect.replay import RolloutBuffer, iterate_minibatches
from rlcollect.testing import CountingEnv
from tests.gpu.helpers import DEVICES, counting_actor_critic, differing_entries

pytestmark = pytest.mark.timeout(120)
N, T = 4, 16
OBS_DIM, ACTION_DIM = 1, 1
ROLLOUTS = 3


def rollouts(device: str) -> list[TensorDictBase]:
    """`ROLLOUTS` rollouts of a CPU `CountingEnv` of `N`, the policy and the buffer on
    `device`, each cloned (to the CPU) once collected."""
    env = CountingEnv(episode_length=(5, 9, 16, 40), batch_size=(N,))
    collector = Collector(
        env, counting_actor_critic(), frames_per_batch=N * T, policy_device=device
    )
    buffer = RolloutBuffer(N, T, OBS_DIM, ACTION_DIM, device=device)
    filled = []
    try:
        for _ in range(ROLLOUTS):
            rollout = collector.collect(num_steps=T, rollout=buffer.start_rollout())
            assert rollout is buffer.rollout
            for name, field in rollout.items(include_nested=True, leaves_only=True):
                assert field.device.type == device, name
            buffer.add(rollout)
            filled.append(buffer.get(flatten=False).cpu().clone())
    finally:
        collector.shutdown()
    return filled


@pytest.mark.parametrize("device", DEVICES)
def test_a_cuda_rollout_from_a_cpu_env_equals_a_cpu_rollout(device: str) -> None:
    ours, reference = rollouts(device), rollouts("cpu")
    for index, (rollout, expected) in enumerate(zip(ours, reference, strict=True)):
        assert not differing_entries(rollout, expected), (
            index,
            differing_entries(rollout, expected),
        )
    last = ours[-1]
    # The bootstrap value at slot T: the actor-critic's value of the last observation.
    assert torch.equal(last["value"][:, T], 2 * last["obs"][:, T, 0] + 1)
    assert last["done"][:, :T].any(), "the rollouts cross episode ends"
    # Rollout k + 1 starts where rollout k stopped.
    assert torch.equal(ours[1]["obs"][:, 0], ours[0]["obs"][:, T])


@pytest.mark.parametrize("device", DEVICES)
def test_minibatches_of_a_cuda_rollout_stay_on_the_gpu_and_cover_every_transition(
    device: str,
) -> None:
    env = CountingEnv(episode_length=100, batch_size=(N,))
    collector = Collector(
        env, counting_actor_critic(), frames_per_batch=N * T, policy_device=device
    )
    buffer = RolloutBuffer(N, T, OBS_DIM, ACTION_DIM, device=device)
    try:
        buffer.add(collector.collect(num_steps=T, rollout=buffer.start_rollout()))
    finally:
        collector.shutdown()
    seen = []
    for minibatch in iterate_minibatches(buffer.get(), 12):
        assert minibatch["obs"].device.type == device
        seen += minibatch["sample_log_prob"].flatten().tolist()
    # sample_log_prob = 1000 * env + step: each of the N * T transitions exactly once.
    assert sorted(seen) == sorted(1000.0 * n + t for n in range(N) for t in range(T))

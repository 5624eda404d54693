"""RolloutGAE over the buffer layout equals our TorchRL-keyed GAE and TorchRL's GAE on the same
transitions, truncations and terminations included, on random rollouts and on collected ones."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.objectives.value import GAE as TorchRLGAE  # noqa: N811

from rlcollect import Collector
from rlcollect.batch.rollout_layout import as_torchrl
from rlcollect.replay import RolloutBuffer
from rlcollect.testing import CountingEnv
from rlcollect.transforms import GAE, RolloutGAE

GAMMA, LMBDA = 0.9, 0.8


def random_rollout(num_envs: int, steps: int, seed: int) -> TensorDict:
    """A buffer-layout rollout with random rewards, values, terminations and truncations;
    `final_value` is random at every end of an episode (it must count only where truncated)."""
    generator = torch.Generator().manual_seed(seed)
    rollout = RolloutBuffer(num_envs, steps, 3, 1).start_rollout()
    shape = rollout.batch_size
    terminated = torch.rand(shape, generator=generator) < 0.15
    truncated = (torch.rand(shape, generator=generator) < 0.15) & ~terminated
    rollout["terminated"] = terminated
    rollout["truncated"] = truncated
    rollout["done"] = terminated | truncated
    rollout["reward"] = torch.randn(shape, generator=generator)
    rollout["value"] = torch.randn(shape, generator=generator)
    rollout["final_value"] = torch.randn(shape, generator=generator) * rollout["done"]
    rollout["obs"] = torch.randn(*shape, 3, generator=generator)
    return rollout


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rollout_gae_equals_our_gae_and_torchrl_s_on_the_same_transitions(seed: int) -> None:
    rollout = random_rollout(num_envs=4, steps=30, seed=seed)
    assert rollout["truncated"][:, :30].any()
    assert rollout["terminated"][:, :30].any()
    transitions = as_torchrl(rollout)
    RolloutGAE(GAMMA, LMBDA)(rollout)
    ours = GAE(GAMMA, LMBDA, None)(transitions)
    theirs = TorchRLGAE(gamma=GAMMA, lmbda=LMBDA, value_network=None)(transitions.clone())
    for reference in (ours, theirs):
        torch.testing.assert_close(rollout["advantage"][:, :30], reference["advantage"][..., 0])
        torch.testing.assert_close(rollout["return"][:, :30], reference["value_target"][..., 0])
    assert not rollout["advantage"][:, 30].any(), "slot T is padding"


def test_the_last_step_bootstraps_from_the_value_of_the_last_observation() -> None:
    rollout = RolloutBuffer(1, 2, 1, 1).start_rollout()
    rollout["reward"][0, :2] = 1.0
    rollout["value"][0] = torch.tensor([0.0, 0.0, 10.0])
    RolloutGAE(gamma=0.5, lmbda=1.0)(rollout)
    assert rollout["advantage"][0].tolist() == [1 + 0.5 * (1 + 0.5 * 10), 1 + 0.5 * 10, 0.0]
    rollout["truncated"][0, 1] = rollout["done"][0, 1] = True  # the episode is cut there
    rollout["final_value"][0, 1] = 4.0  # its last observation's value, not obs[2]'s
    RolloutGAE(gamma=0.5, lmbda=1.0)(rollout)
    assert rollout["advantage"][0].tolist() == [1 + 0.5 * (1 + 0.5 * 4), 1 + 0.5 * 4, 0.0]
    rollout["terminated"][0, 1] = True  # a termination bootstraps from nothing
    RolloutGAE(gamma=0.5, lmbda=1.0)(rollout)
    assert rollout["advantage"][0].tolist() == [1 + 0.5, 1.0, 0.0]


class CountingActorCritic(nn.Module):
    """Action 0, log-probability 0, `state_value = 2 * observation + 1`."""

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, ...]:
        action = torch.zeros(observation.shape[:-1], dtype=torch.int64)
        return action, torch.zeros(observation.shape[:-1]), 2 * observation + 1


def counting_collector(num_envs: int, steps: int) -> Collector:
    """Episodes terminated after 5 steps or truncated after 3, staggered over the envs."""
    policy = TensorDictModule(
        CountingActorCritic(), ["observation"], ["action", "sample_log_prob", "state_value"]
    )
    env = CountingEnv(episode_length=[2, 5, 3, 4], batch_size=(num_envs,))
    return Collector(env, policy, frames_per_batch=num_envs * steps, max_frames_per_traj=3)


def test_on_collected_rollouts_it_equals_gae_on_the_torchrl_batch_of_the_same_steps() -> None:
    num_envs, steps = 4, 13  # not every episode ends at the last step
    rollout = RolloutBuffer(num_envs, steps, 1, 1).start_rollout()
    buffer_collector = counting_collector(num_envs, steps)
    batch_collector = counting_collector(num_envs, steps)
    value_network = TensorDictModule(lambda obs: 2 * obs + 1, ["observation"], ["state_value"])
    for _ in range(2):  # the second rollout starts where the first stopped
        buffer_collector.collect(num_steps=steps, rollout=rollout)
        batch = batch_collector.next()  # the same steps, with their final observations
        assert torch.equal(rollout["obs"][:, :steps], batch["observation"])
        assert rollout["truncated"].any()
        assert rollout["terminated"].any()
        RolloutGAE(GAMMA, LMBDA)(rollout)
        reference = GAE(GAMMA, LMBDA, value_network)(batch)
        torch.testing.assert_close(rollout["advantage"][:, :steps], reference["advantage"][..., 0])
        torch.testing.assert_close(rollout["return"][:, :steps], reference["value_target"][..., 0])


def test_attached_fields_are_written_in_place() -> None:
    rollout = random_rollout(2, 5, seed=0)
    RolloutGAE(GAMMA, LMBDA)(rollout)
    advantage = rollout["advantage"]
    RolloutGAE(GAMMA, LMBDA)(rollout)
    assert rollout["advantage"] is advantage, "the field's tensor is reused"


def test_misuse_is_refused_naming_what_is_missing() -> None:
    frame = RolloutBuffer.frame_example((3,), ())
    torchrl_rollout = RolloutBuffer(2, 5, spec_or_example=frame).start_rollout()
    with pytest.raises(TypeError, match=r"for TorchRL's keys use rlcollect\.transforms\.GAE"):
        RolloutGAE(GAMMA, LMBDA)(torchrl_rollout)
    with pytest.raises(KeyError, match="no 'final_value' field"):
        RolloutGAE(GAMMA, LMBDA)(random_rollout(2, 5, seed=0).exclude("final_value"))
    with pytest.raises(ValueError, match="lmbda must be in"):
        RolloutGAE(0.9, 1.5)

"""`GymVectorEnv` under Gymnasium's default next-step autoreset: our Collector's batches against a
plain `SyncVectorEnv` loop replayed with the same actions."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import pytest
import torch
from gymnasium.vector import AutoresetMode

from rlcollect import Collector, keys
from rlcollect.envs import GymVectorEnv
from rlcollect.testing.next_step_replay import (
    assert_batch_matches_replay,
    episode_returns,
    replay_next_step_loop,
)

SEED = 5
NUM_ENVS = 4
STEPS = 60  # random CartPole episodes last ~20 steps: each sub-env ends a few times


def next_step_cartpoles() -> gym.vector.SyncVectorEnv:
    return gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1")] * NUM_ENVS, autoreset_mode=AutoresetMode.NEXT_STEP
    )


def two_calls(env: GymVectorEnv) -> Callable[[int], None]:
    def step_then_advance(t: int) -> None:
        env.step_into(t)
        env.advance_into(t)

    return step_then_advance


@pytest.mark.parametrize("fused", [True, False], ids=["step-and-advance", "step-then-advance"])
def test_collector_batches_equal_sync_vector_loop_replayed(fused: bool) -> None:
    env = GymVectorEnv(next_step_cartpoles(), categorical_action_encoding=True)
    if not fused:  # the two-call path that envs under a transform take
        env.step_and_advance_into = two_calls(env)  # type: ignore[method-assign]
    env.set_seed(SEED)
    frames = NUM_ENVS * STEPS // 2
    collector = Collector(env, None, frames_per_batch=frames, total_frames=2 * frames)
    batches = [batch.clone() for batch in collector]
    collector.shutdown()
    data = torch.cat(batches, dim=1)
    assert data.batch_size == (NUM_ENVS, STEPS)  # no reset-only step in the batches
    assert collector.frames == 2 * frames  # nor in the frame count
    plain = next_step_cartpoles()
    plain.reset(seed=SEED)
    observation, _ = plain.reset()
    replay = replay_next_step_loop(plain, observation, data[keys.ACTION].numpy())
    plain.close()
    assert assert_batch_matches_replay(data, replay) > 0
    returns = episode_returns(replay)  # and episode returns run on across the reset
    stats = collector.stats()
    assert stats["episodes"] == len(returns)
    assert stats["mean_return_last_100"] == pytest.approx(sum(returns) / len(returns))


def test_next_step_is_the_mode_of_a_vector_env_from_an_id_when_asked() -> None:
    env = GymVectorEnv("CartPole-v1", num_envs=2, autoreset_mode="NextStep")
    assert env.vector_env.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
    env.close()

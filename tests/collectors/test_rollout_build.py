"""`RolloutLoop.build`: the engine's loop assembled over an env for a door that runs it itself;
with `start_from`, a loop of another batch length goes on from where the first stands (same
trajectories, no reset), as RLlib's door needs when `sample()` is asked for another count."""

from __future__ import annotations

import torch

from rlcollect import keys
from rlcollect.collectors.policy.holder import PolicyHolder
from rlcollect.collectors.rollout import RolloutLoop
from rlcollect.testing.counting import CountingEnv


def random_holder(env: CountingEnv) -> PolicyHolder:
    return PolicyHolder(None, env.observation_keys, torch.device("cpu"))


def observations(loop: RolloutLoop) -> list[list[float]]:
    return loop.layout.batch_view[keys.OBSERVATION][..., 0].tolist()


def test_a_built_loop_collects_batches_that_continue() -> None:
    env = CountingEnv(episode_length=5, batch_size=(2,))
    loop = RolloutLoop.build(env, random_holder(env), 3)
    loop.collect(random_actions=True)
    assert observations(loop) == [[0.0, 1.0, 2.0]] * 2
    loop.collect(random_actions=True)
    assert observations(loop) == [[3.0, 4.0, 0.0]] * 2
    traj = loop.layout.batch_view[keys.TRAJ_IDS].tolist()
    assert traj == [[0, 0, 2], [1, 1, 3]]


def test_a_loop_of_another_length_goes_on_without_a_reset() -> None:
    env = CountingEnv(episode_length=5, batch_size=(2,))
    short = RolloutLoop.build(env, random_holder(env), 2)
    short.collect(random_actions=True)
    longer = RolloutLoop.build(env, random_holder(env), 4, start_from=short)
    assert longer.stream is short.stream
    longer.collect(random_actions=True)
    # The episode goes on (2, 3, 4), ends, and the next starts at 0: no reset in between.
    assert observations(longer) == [[2.0, 3.0, 4.0, 0.0]] * 2
    first_ids = short.layout.batch_view[keys.TRAJ_IDS][:, 0].tolist()
    assert longer.layout.batch_view[keys.TRAJ_IDS][:, 0].tolist() == first_ids
    # Back to the short loop: it takes up where the longer one stands.
    short.layout.carry_from(longer.layout)
    short.collect(random_actions=True)
    assert observations(short) == [[1.0, 2.0]] * 2

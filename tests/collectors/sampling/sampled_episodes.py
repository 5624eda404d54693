"""Deterministic policies, envs and episode checks shared by the `sample()` tests."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule

from rlcollect import AgentEpisodes, Episode, EpisodeJoiner, keys
from rlcollect.testing import CountingEnv

Sampled = Episode | AgentEpisodes
SPREAD_WEIGHTS = torch.linspace(-1.0, 1.0, 18 * 5).reshape(18, 5)


def step_parity(observation: torch.Tensor) -> torch.Tensor:
    """The counting env's action: the parity of the step count (known in advance)."""
    return observation[..., 0].long() % 2


def spread_greedy(observation: torch.Tensor) -> torch.Tensor:
    """simple_spread's actions: the argmax of a fixed linear map of each agent's observation."""
    return (observation @ SPREAD_WEIGHTS).argmax(-1)


# Deterministic policies (module-level functions: worker processes unpickle them), so that a
# collector sampled and one iterated by hand take the same actions.
PARITY = TensorDictModule(step_parity, in_keys=["observation"], out_keys=["action"])
SPREAD = TensorDictModule(
    spread_greedy, in_keys=[("agent", "observation")], out_keys=[("agent", "action")]
)


def counting(length: int | tuple[int, ...] = 5, batch: tuple[int, ...] = ()) -> CountingEnv:
    return CountingEnv(episode_length=length, batch_size=batch)


def by_hand(collector: Any) -> list[Episode]:
    """Every episode that ends, joined from the collector's batches (then shut down)."""
    joiner = EpisodeJoiner()
    with collector:
        return [episode for batch in collector for episode in joiner.add(batch)]


def sample_until_stop(collector: Any, **arguments: int) -> list[list[Sampled]]:
    """The lists of every `sample(**arguments)` call until StopIteration (then shut down)."""
    calls = []
    with collector:
        while True:
            try:
                calls.append(collector.sample(**arguments))
            except StopIteration:
                return calls


def stitched(calls: Iterable[list[Episode]]) -> dict[int, Episode]:
    """Each episode's chunks, in the order handed out, joined into one; checks that each
    chunk starts where the one before it stopped, and that only the last is done."""
    chunks: dict[int, list[Episode]] = {}
    for chunk in (chunk for call in calls for chunk in call):
        before = chunks.setdefault(chunk.id_, [])
        if before:
            assert not before[-1].is_done, f"episode {chunk.id_} goes on after it ended"
            assert chunk.t_started == before[-1].t
            last_observation = before[-1].get_observations()[-1]
            assert torch.equal(chunk.get_observations()[0], last_observation)
        else:
            assert chunk.t_started == 0, f"episode {chunk.id_} lost its first steps"
        before.append(chunk)
    return {
        episode_id: Episode(torch.cat([chunk.transitions for chunk in pieces], 0))
        for episode_id, pieces in chunks.items()
    }


def assert_same(episode: Episode, expected: Episode, ignore: Iterable[Any] = ()) -> None:
    """Equal transitions, key by key (but the keys to `ignore`, e.g. trajectory ids given by
    another collector)."""
    ignore = set(ignore)
    if keys.TRAJ_IDS not in ignore:
        assert episode.id_ == expected.id_
    assert len(episode) == len(expected)
    got, want = episode.transitions.exclude(*ignore), expected.transitions.exclude(*ignore)
    assert set(got.keys(True, True)) == set(want.keys(True, True))
    for key in want.keys(include_nested=True, leaves_only=True):
        assert torch.equal(got[key], want[key]), (episode.id_, key)


def assert_counts(episode: Episode, length: int, start: int = 0) -> None:
    """The counting env's steps `start .. start + len`: observations count up, reward 1."""
    observations = episode.get_observations().flatten().tolist()
    assert observations == [float(step) for step in range(start, start + len(episode) + 1)]
    assert episode.get_rewards().flatten().tolist() == [1.0] * len(episode)
    assert episode.is_terminated == (start + len(episode) == length)
    assert not episode.is_truncated


def spread_env(seed: int = 0, max_cycles: int = 7) -> Any:
    """mpe2's simple_spread, 3 agents in group "agent", episodes truncated at `max_cycles`."""
    pytest.importorskip("mpe2")
    from mpe2 import simple_spread_v3

    from rlcollect.envs.pettingzoo_env import PettingZooEnv

    env = simple_spread_v3.parallel_env(N=3, continuous_actions=False, max_cycles=max_cycles)
    return PettingZooEnv(env, seed=seed)


def assert_agent_episodes(episode: AgentEpisodes, env_transitions: TensorDictBase) -> None:
    """Agent i's episode reads group "agent"'s entries at index i of the env episode."""
    assert episode.agent_ids == [("agent", 0), ("agent", 1), ("agent", 2)]
    for (group, index), agent in episode.agent_episodes.items():
        assert agent.id_ == episode.id_
        assert (agent.t_started, len(agent)) == (episode.t_started, len(episode))
        last = env_transitions["next", group, "observation"][-1:]
        observations = torch.cat([env_transitions[group, "observation"], last])
        assert torch.equal(agent.get_observations(), observations[:, index])
        assert torch.equal(agent.get_actions(), env_transitions[group, "action"][:, index])
        assert torch.equal(agent.get_rewards(), env_transitions["next", group, "reward"][:, index])
        assert agent.is_truncated == episode.is_truncated
    total = float(env_transitions["next", "agent", "reward"].sum())
    assert episode.get_return() == pytest.approx(total)

"""RLlib's `sample(num_timesteps=..., num_episodes=...)` on `RayCollector` (issue 23): the
same `CollectorBase.sample()` as every collector, on the batches the driver gathers (sync) or
receives actor by actor (async), against episodes collected by hand.

Actor 0 runs the counting env's 3-step episodes and actor 1 its 5-step ones, so every value
is known in advance.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import pytest

from rlcollect import AgentEpisodes, Collector, Episode, keys
from rlcollect.collectors import RayCollector
from tests.collectors.ray.helpers import RAY_TEST_TIMEOUT, counting_env
from tests.collectors.sampling.sampled_episodes import (
    PARITY,
    SPREAD,
    assert_agent_episodes,
    assert_counts,
    assert_same,
    by_hand,
    counting,
    sample_until_stop,
    spread_env,
    stitched,
)

pytest.importorskip("ray")

pytestmark = [
    pytest.mark.timeout(RAY_TEST_TIMEOUT),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]
MAKERS = [counting_env(3), counting_env(5)]


def ray_collector(sync: bool = True, **options: Any) -> RayCollector:
    return RayCollector(
        options.pop("create_env_fn", MAKERS),
        options.pop("policy", PARITY),
        frames_per_batch=options.pop("frames_per_batch", 8),
        total_frames=options.pop("total_frames", 48),
        sync=sync,
        **options,
    )


def by_hand_in_this_process(length: int) -> list[Episode]:
    """An actor's episodes collected by hand: its collector (a counting env of `length`-step
    episodes, the same policy, 4 steps per batch, 24 steps) run here and joined."""
    return by_hand(Collector(counting(length), PARITY, frames_per_batch=4, total_frames=24))


def assert_actors_episodes(episodes: Iterable[Episode]) -> None:
    """Actor 0's and actor 1's episodes (told apart by their length, 3 or 5), in id order,
    equal those collected by hand (trajectory ids aside: the actors get their own)."""
    for length in (3, 5):
        mine = sorted((e for e in episodes if len(e) == length), key=lambda e: e.id_)
        expected = by_hand_in_this_process(length)
        assert len(mine) == len(expected) == 24 // length
        for episode, by_joiner in zip(mine, expected, strict=True):
            assert_same(episode, by_joiner, ignore=[keys.TRAJ_IDS])


def test_sync_num_episodes_returns_the_episodes_collected_by_hand() -> None:
    calls = sample_until_stop(ray_collector(), num_episodes=3)
    assert [len(call) for call in calls] == [3, 3, 3, 3]
    returned = [episode for call in calls for episode in call]
    assert all(episode.is_done and episode.t_started == 0 for episode in returned)
    assert len({episode.id_ for episode in returned}) == 12
    assert_actors_episodes(returned)


def test_sync_num_timesteps_chunks_join_into_the_episodes_collected_by_hand() -> None:
    calls = sample_until_stop(ray_collector(), num_timesteps=10)
    assert [sum(map(len, call)) for call in calls] == [16, 16, 16], "two gathered batches"
    episodes = stitched(calls)
    running = [episode for episode in episodes.values() if not episode.is_done]
    assert [len(episode) for episode in running] == [4], "actor 1's running one"
    assert_counts(running[0], 5)
    assert_actors_episodes([episode for episode in episodes.values() if episode.is_done])


def test_async_samples_every_actors_episodes_once() -> None:
    collector = ray_collector(sync=False, frames_per_batch=4, track_worker_id=True)
    first = collector.sample(num_episodes=4)
    rest = sample_until_stop(collector, num_timesteps=7)
    assert len(first) == 4
    assert all(episode.is_done and episode.t_started == 0 for episode in first)
    calls = [first, *rest]
    assert sum(len(chunk) for call in calls for chunk in call) == 48, "every step, once"
    episodes = stitched(calls)
    for episode in episodes.values():
        actor = int(episode.transitions["collector", "worker_id"][0])
        assert_counts(episode, (3, 5)[actor])
    assert {len(episode) for episode in episodes.values() if episode.is_done} == {3, 5}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_multi_agent_episodes_come_grouped_from_the_actors() -> None:
    pytest.importorskip("mpe2")
    makers = [functools.partial(spread_env, seed) for seed in (0, 1)]
    collector = ray_collector(
        create_env_fn=makers, policy=SPREAD, frames_per_batch=10, total_frames=40
    )
    with collector:
        episodes = collector.sample(num_episodes=4)
    assert len({episode.id_ for episode in episodes}) == 4
    for episode in episodes:
        assert isinstance(episode, AgentEpisodes)
        assert (len(episode), episode.is_truncated) == (7, True)
        assert_agent_episodes(episode, episode.env_episode.transitions)

"""RLlib's `EnvRunner.sample(num_timesteps=..., num_episodes=...)` on `Collector` and the
multi-process collectors (issue 23), against episodes collected by hand: the same seeded
collector iterated and its batches joined by `EpisodeJoiner`, and the counting env's episodes,
whose every value is known in advance (observation = steps since reset, reward 1, terminated
at the episode length).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import pytest

from rlcollect import (
    AgentEpisodes,
    Collector,
    MultiAsyncCollector,
    MultiSyncCollector,
    ReplayBuffer,
)
from tests.collectors.sampling.sampled_episodes import (
    PARITY,
    SPREAD,
    Sampled,
    assert_agent_episodes,
    assert_counts,
    assert_same,
    by_hand,
    counting,
    sample_until_stop,
    spread_env,
    stitched,
)


def seeded(make: Callable[[], Any], seed: int = 0) -> Any:
    collector = make()
    collector.set_seed(seed)
    return collector


# --- Collector: num_timesteps ---------------------------------------------------------------------


def single(length: int = 5, frames_per_batch: int = 4, total_frames: int = 40) -> Collector:
    return Collector(
        counting(length), PARITY, frames_per_batch=frames_per_batch, total_frames=total_frames
    )


def test_num_timesteps_hands_out_whole_batches_as_chunks() -> None:
    collector = seeded(single)
    first = collector.sample(num_timesteps=6)  # two batches of 4: steps 0-7
    assert [(e.id_, e.t_started, len(e), e.is_done) for e in first] == [
        (0, 0, 5, True),
        (1, 0, 3, False),
    ]
    assert_counts(first[0], 5)
    assert_counts(first[1], 5)
    second = collector.sample(num_timesteps=1)  # one batch: steps 8-11
    assert [(e.id_, e.t_started, len(e), e.is_done) for e in second] == [
        (1, 3, 2, True),
        (2, 0, 2, False),
    ]
    assert_counts(second[0], 5, start=3)
    collector.shutdown()


def test_num_timesteps_chunks_join_into_the_episodes_collected_by_hand() -> None:
    calls = sample_until_stop(seeded(single), num_timesteps=6)
    assert all(sum(map(len, call)) >= 6 for call in calls)
    assert sum(len(chunk) for call in calls for chunk in call) == 40, "every step, once"
    episodes = stitched(calls)
    expected = by_hand(seeded(single))
    assert len(expected) == 8
    for episode in expected:
        assert_same(episodes.pop(episode.id_), episode)
    assert list(episodes) == [], "no episode beyond those collected by hand"


def test_no_argument_hands_out_one_batch() -> None:
    collector = seeded(single)
    calls = [collector.sample() for _ in range(3)]
    collector.shutdown()
    assert [sum(map(len, call)) for call in calls] == [4, 4, 4]
    expected = by_hand(seeded(functools.partial(single, total_frames=12)))
    episodes = stitched(calls)
    for episode in expected:
        assert_same(episodes[episode.id_], episode)


# --- Collector: num_episodes ----------------------------------------------------------------------


def test_num_episodes_returns_the_episodes_collected_by_hand_in_order() -> None:
    calls = sample_until_stop(seeded(single), num_episodes=3)
    assert [len(call) for call in calls] == [3, 3, 2], "the last call has what ended"
    expected = by_hand(seeded(single))
    returned = [episode for call in calls for episode in call]
    assert len(returned) == len(expected) == 8
    for episode, by_joiner in zip(returned, expected, strict=True):
        assert episode.is_done
        assert episode.t_started == 0
        assert_same(episode, by_joiner)


def test_steps_past_the_episodes_asked_for_wait_for_the_next_call() -> None:
    collector = seeded(functools.partial(single, frames_per_batch=12, total_frames=48))
    first = collector.sample(num_episodes=1)  # one batch of 12 steps: two episodes end
    assert [episode.id_ for episode in first] == [0]
    assert collector.frames == 12
    second = collector.sample(num_episodes=1)  # already there: nothing is collected
    assert [episode.id_ for episode in second] == [1]
    assert collector.frames == 12
    rest = collector.sample(num_timesteps=1)  # the running episode's first two steps
    assert [(e.id_, e.t_started, len(e), e.is_done) for e in rest] == [(2, 0, 2, False)]
    assert collector.frames == 12
    collector.shutdown()


def test_an_episode_handed_out_in_chunks_ends_as_its_rest() -> None:
    collector = seeded(single)
    (chunk,) = [e for e in collector.sample(num_timesteps=4) if not e.is_done]
    (rest,) = collector.sample(num_episodes=1)
    collector.shutdown()
    assert (chunk.id_, chunk.t_started, len(chunk)) == (0, 0, 4)
    assert (rest.id_, rest.t_started, len(rest), rest.is_done) == (0, 4, 1, True)
    assert_counts(rest, 5, start=4)


def test_mixed_calls_lose_and_double_nothing() -> None:
    collector = seeded(functools.partial(single, length=7, frames_per_batch=3, total_frames=60))
    calls: list[list[Sampled]] = []
    arguments = [{"num_timesteps": 5}, {"num_episodes": 2}, {}, {"num_episodes": 1}]
    with collector:
        for turn in range(100):
            try:
                calls.append(collector.sample(**arguments[turn % len(arguments)]))
            except StopIteration:
                break
        with contextlib.suppress(StopIteration):  # what a last num_episodes call left running
            calls.append(collector.sample())
        with pytest.raises(StopIteration):
            collector.sample(num_timesteps=1)
    assert sum(len(chunk) for call in calls for chunk in call) == 60
    episodes = stitched(calls)
    expected = by_hand(seeded(functools.partial(single, 7, 3, 60)))
    for episode in expected:
        assert_same(episodes.pop(episode.id_), episode)
    (running,) = episodes.values()  # collected, never ended: steps 56-59
    assert_counts(running, 7)
    assert len(running) == 4


def test_batched_envs_hand_out_every_sub_envs_episodes() -> None:
    def make() -> Collector:
        env = counting((3, 5), (2,))
        return Collector(env, PARITY, frames_per_batch=8, total_frames=64)

    returned = [e for call in sample_until_stop(seeded(make), num_episodes=4) for e in call]
    expected = by_hand(seeded(make))
    assert sorted(len(episode) for episode in returned) == [3] * 10 + [5] * 6
    for episode, by_joiner in zip(returned, expected, strict=True):
        assert_counts(episode, len(episode))
        assert_same(episode, by_joiner)


def test_whole_episode_and_compact_batches_sample_alike() -> None:
    for options in ({"batch_mode": "complete_episodes"}, {"store_obs_once": True}):
        make = functools.partial(
            Collector, counting(5), None, frames_per_batch=4, total_frames=40, **options
        )
        returned = sample_until_stop(seeded(make), num_episodes=2)
        episodes = [episode for call in returned for episode in call]
        assert [episode.id_ for episode in episodes] == list(range(len(episodes)))
        assert len(episodes) >= 7, options
        for episode in episodes:
            assert_counts(episode, 5)


# --- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        (
            {"num_timesteps": 5, "num_episodes": 2},
            ValueError,
            r"num_timesteps or num_episodes, not both; got num_timesteps=5 and num_episodes=2",
        ),
        ({"num_timesteps": 0}, ValueError, r"num_timesteps must be a positive int .*got 0"),
        ({"num_episodes": -3}, ValueError, r"num_episodes must be a positive int .*got -3"),
        ({"num_episodes": 2.5}, TypeError, r"num_episodes must be a positive int .*got 2.5"),
        ({"num_timesteps": True}, TypeError, r"num_timesteps must be a positive int .*True"),
    ],
)
def test_bad_arguments_are_named(arguments: dict, error: type, match: str) -> None:
    collector = single()
    with pytest.raises(error, match=match):
        collector.sample(**arguments)
    assert collector.frames == 0, "nothing was collected"
    collector.shutdown()


def test_a_collector_filling_a_replay_buffer_refuses_to_sample() -> None:
    buffer = ReplayBuffer()
    collector = Collector(counting(), None, frames_per_batch=4, replay_buffer=buffer)
    with pytest.raises(RuntimeError, match=r"writes them to its replay_buffer"):
        collector.sample(num_episodes=1)
    assert collector.frames == 0
    collector.shutdown()


def test_total_frames_running_out_returns_what_is_there_then_stops() -> None:
    collector = single(total_frames=12)  # episodes 0 and 1 end; 2 runs
    assert len(collector.sample(num_episodes=5)) == 2
    with pytest.raises(StopIteration):
        collector.sample(num_episodes=1)
    (running,) = collector.sample()
    assert (running.id_, running.t_started, len(running)) == (2, 0, 2)
    with pytest.raises(StopIteration):
        collector.sample()
    collector.shutdown()


def test_return_same_td_batches_are_kept_as_they_were() -> None:
    make = functools.partial(
        Collector, counting(7), None, frames_per_batch=3, total_frames=21, return_same_td=True
    )
    for episode in sample_until_stop(seeded(make), num_episodes=1):
        assert_counts(episode[0], 7)


# --- multi-agent ----------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_multi_agent_episodes_hold_one_episode_per_agent() -> None:
    def make() -> Collector:
        return Collector(spread_env(), SPREAD, frames_per_batch=5, total_frames=30)

    calls = sample_until_stop(seeded(make), num_timesteps=5)
    expected = by_hand(seeded(make))  # 7-step episodes, truncated by max_cycles
    assert [len(episode) for episode in expected] == [7, 7, 7, 7]
    assert all(isinstance(e, AgentEpisodes) for call in calls for e in call)
    episodes: dict[int, list[AgentEpisodes]] = {}
    for chunk in (chunk for call in calls for chunk in call):
        episodes.setdefault(chunk.id_, []).append(chunk)
    for whole in expected:
        chunks = episodes.pop(whole.id_)
        assert chunks[-1].is_truncated
        assert [chunk.t_started for chunk in chunks] == [0, *[c.t for c in chunks[:-1]]]
        start = 0
        for chunk in chunks:
            assert_agent_episodes(chunk, whole.transitions[start : chunk.t])
            start = chunk.t
    assert sum(len(chunk) for chunks in episodes.values() for chunk in chunks) == 2


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_multi_agent_num_episodes_returns_whole_env_episodes() -> None:
    collector = Collector(spread_env(), None, frames_per_batch=5, total_frames=30)
    with collector:
        episodes = collector.sample(num_episodes=2)
    assert [(episode.id_, len(episode), episode.is_done) for episode in episodes] == [
        (0, 7, True),
        (1, 7, True),
    ]
    for episode in episodes:
        assert_agent_episodes(episode, episode.env_episode.transitions)
        for agent in episode.agent_episodes.values():
            assert agent.transitions["next", "reward"].shape == (7, 1)


# --- multi-process collectors ---------------------------------------------------------------------

MAKERS = [functools.partial(counting, 3), functools.partial(counting, 5)]


def multi_sync(**options: Any) -> MultiSyncCollector:
    return MultiSyncCollector(MAKERS, PARITY, frames_per_batch=8, total_frames=48, **options)


@pytest.mark.parametrize("arguments", [{"num_timesteps": 10}, {"num_episodes": 3}])
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
@pytest.mark.timeout(120)
def test_multi_sync_samples_the_episodes_collected_by_hand(arguments: dict) -> None:
    calls = sample_until_stop(seeded(multi_sync), **arguments)
    expected = by_hand(seeded(multi_sync))  # worker 0's 3-step episodes, worker 1's 5-step
    if "num_episodes" in arguments:
        returned = [episode for call in calls for episode in call]
        assert all(len(call) == 3 for call in calls[:-1])
        assert [episode.id_ for episode in returned] == [episode.id_ for episode in expected]
        for episode, by_joiner in zip(returned, expected, strict=True):
            assert_same(episode, by_joiner)
        return
    assert all(sum(map(len, call)) >= 10 for call in calls[:-1])
    assert sum(len(chunk) for call in calls for chunk in call) == 48
    episodes = stitched(calls)
    for episode in expected:
        assert_counts(episode, len(episode))
        assert_same(episodes.pop(episode.id_), episode)
    assert [len(episode) for episode in episodes.values()] == [4], "worker 1's running one"


@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
@pytest.mark.timeout(120)
def test_multi_async_samples_every_workers_episodes_once() -> None:
    collector = MultiAsyncCollector(
        MAKERS, None, frames_per_batch=4, total_frames=48, track_worker_id=True
    )
    first = collector.sample(num_episodes=4)
    rest = sample_until_stop(collector, num_timesteps=7)
    assert len(first) == 4
    assert all(episode.is_done and episode.t_started == 0 for episode in first)
    calls = [first, *rest]
    assert sum(len(chunk) for call in calls for chunk in call) == 48, "every step, once"
    episodes = stitched(calls)
    for episode in episodes.values():
        worker = int(episode.transitions["collector", "worker_id"][0])
        assert_counts(episode, (3, 5)[worker])
    assert {len(episode) for episode in episodes.values() if episode.is_done} == {3, 5}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
@pytest.mark.timeout(120)
def test_multi_sync_groups_each_workers_agents_per_env_episode() -> None:
    makers = [functools.partial(spread_env, seed) for seed in (0, 1)]
    collector = MultiSyncCollector(makers, None, frames_per_batch=10, total_frames=40)
    with collector:
        episodes = collector.sample(num_episodes=4)
    assert len({episode.id_ for episode in episodes}) == 4
    for episode in episodes:
        assert isinstance(episode, AgentEpisodes)
        assert (len(episode), episode.is_truncated) == (7, True)
        assert_agent_episodes(episode, episode.env_episode.transitions)

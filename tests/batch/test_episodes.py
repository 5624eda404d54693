"""`EpisodeJoiner` / `Episode`: whole episodes joined across batches, RLlib's episode view."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDictBase

from rlcollect import Collector, Episode, EpisodeJoiner, MultiAsyncCollector, keys
from rlcollect.testing import CountingEnv


def counting(length: int | tuple[int, ...] = 7, batch: tuple[int, ...] = ()) -> CountingEnv:
    return CountingEnv(episode_length=length, batch_size=batch)


def joined(collector: Collector, joiner: EpisodeJoiner | None = None) -> list[Episode]:
    joiner = joiner or EpisodeJoiner()
    episodes = [episode for batch in collector for episode in joiner.add(batch)]
    collector.shutdown()
    return episodes


def assert_counts_from_zero(episode: Episode, length: int) -> None:
    observations = episode.get_observations().flatten()
    assert observations.tolist() == [float(step) for step in range(length + 1)]


def test_an_episode_joined_across_three_batches_equals_it_collected_in_one() -> None:
    pieces = joined(Collector(counting(7), None, frames_per_batch=3, total_frames=21))
    whole = joined(Collector(counting(7), None, frames_per_batch=21, total_frames=21))
    assert [len(episode) for episode in pieces] == [7, 7, 7]
    for split, single in zip(pieces, whole, strict=True):
        for key in single.transitions.keys(include_nested=True, leaves_only=True):
            if key != keys.ACTION:  # random actions, drawn afresh
                assert torch.equal(split.transitions[key], single.transitions[key]), key


def test_the_episode_view_reads_as_rllibs() -> None:
    (first, *_) = joined(Collector(counting(4), None, frames_per_batch=3, total_frames=12))
    assert len(first) == 4
    assert first.get_observations().shape == (5, 1)
    assert_counts_from_zero(first, 4)
    assert first.get_actions().shape == (4,)
    assert first.get_rewards().flatten().tolist() == [1.0] * 4
    assert first.get_return() == 4.0
    assert first.is_terminated
    assert not first.is_truncated
    assert first.is_done
    assert first.transitions.names == ["time"]
    assert "len=4" in repr(first)


def test_batched_envs_keep_each_sub_envs_episodes() -> None:
    episodes = joined(Collector(counting((3, 5), (2,)), None, frames_per_batch=8, total_frames=64))
    lengths = sorted({len(episode) for episode in episodes})
    assert lengths == [3, 5]
    for episode in episodes:
        assert_counts_from_zero(episode, len(episode))
    assert len({episode.id_ for episode in episodes}) == len(episodes)


def test_a_time_limit_and_a_soft_horizon_end_truncated_episodes() -> None:
    limited = joined(
        Collector(counting(50), None, frames_per_batch=4, total_frames=24, max_frames_per_traj=5)
    )
    assert [len(episode) for episode in limited] == [5, 5, 5, 5]
    assert all(episode.is_truncated and not episode.is_terminated for episode in limited)
    soft = joined(
        Collector(
            counting(50),
            None,
            frames_per_batch=4,
            total_frames=24,
            max_frames_per_traj=5,
            soft_horizon=True,
        )
    )
    assert [len(episode) for episode in soft] == [5, 5, 5, 5]
    # no reset at a soft cut: the count goes on from one piece to the next
    assert soft[1].get_observations()[0].item() == 5.0
    assert all(episode.is_truncated for episode in soft)


def test_split_and_compact_batches_give_the_same_episodes() -> None:
    def run(**options: object) -> list[TensorDictBase]:
        collector = Collector(counting(4), None, frames_per_batch=6, total_frames=24, **options)
        return [episode.transitions.exclude(keys.ACTION) for episode in joined(collector)]

    standard = run()
    for options in ({"split_trajs": True}, {"store_obs_once": True}):
        episodes = run(**options)
        assert len(episodes) == len(standard) == 6
        for theirs, ours in zip(standard, episodes, strict=True):
            for key in theirs.keys(include_nested=True, leaves_only=True):
                assert torch.equal(theirs[key], ours[key]), (options, key)


@pytest.mark.timeout(120)
def test_interleaved_batches_of_an_asynchronous_collector_are_joined_by_id() -> None:
    collector = MultiAsyncCollector(
        [lambda: counting(5), lambda: counting(7)], frames_per_batch=6, total_frames=96
    )
    episodes = joined(collector)
    assert sorted({len(episode) for episode in episodes}) == [5, 7]
    for episode in episodes:
        assert_counts_from_zero(episode, len(episode))
        assert episode.is_terminated


def test_bad_input_is_named() -> None:
    batch = Collector(counting(3), None, frames_per_batch=4, track_traj_ids=False).next()
    with pytest.raises(KeyError, match="track_traj_ids=True"):
        EpisodeJoiner().add(batch)
    with pytest.raises(TypeError, match="end_keys must be a non-empty list"):
        EpisodeJoiner(end_keys="done")
    joiner = EpisodeJoiner()
    joiner.add(Collector(counting(9), None, frames_per_batch=4).next())
    assert joiner.running == 1
    joiner.drop_running()
    assert joiner.running == 0

"""RLlib-style sampling on RayCollector (issue 12): every actor applies `batch_mode`,
`trajs_per_batch`, the horizons and `view_requirements`; the driver gathers.

Actor 0 runs episodes of 3 steps and actor 1 episodes of 5, so whole-episode batches differ
in length from actor to actor and every value below is known in advance.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from tensordict import TensorDictBase

from rlcollect import ViewRequirement, keys
from rlcollect.collectors import RayCollector
from tests.collectors.ray.helpers import RAY_TEST_TIMEOUT
from tests.collectors.ray.helpers import counting_env as plain_counting_env
from tests.collectors.sampling.trajectory_views import (
    VIEWS,
    counting_env,
    echo_policy,
    expected_view,
)
from tests.collectors.sampling.whole_episodes import assert_whole, episodes_of

pytest.importorskip("ray")

pytestmark = [
    pytest.mark.timeout(RAY_TEST_TIMEOUT),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]
# Actor 0's episodes last 3 steps, actor 1's 5.
MAKERS = [plain_counting_env(3), plain_counting_env(5)]
VIEW_NAMES = ["obs_range", "action_pair", "reward_minus_one"]


def by_actor(batches: list[TensorDictBase]) -> dict[int, list[TensorDictBase]]:
    """`sync=False` batches, actor by actor, in the order each actor delivered them."""
    grouped: dict[int, list[TensorDictBase]] = {}
    for batch in batches:
        actor = batch[keys.WORKER_ID].flatten()
        assert (actor == actor[0]).all()
        grouped.setdefault(int(actor[0]), []).append(batch.exclude(keys.WORKER_ID))
    assert sorted(grouped) == [0, 1], "both actors delivered"
    return grouped


def collect(sync: bool, frames_per_batch: int, total_frames: int, **options: Any) -> list[Any]:
    with RayCollector(
        options.pop("create_env_fn", MAKERS),
        options.pop("policy", None),
        frames_per_batch=frames_per_batch,
        total_frames=total_frames,
        sync=sync,
        track_worker_id=not sync,
        **options,
    ) as collector:
        batches = list(collector)
        if "batch_mode" in options or "trajs_per_batch" in options:
            with pytest.raises(TypeError, match=r"whole episodes has no length"):
                len(collector)
    return batches


# --- whole episodes -------------------------------------------------------------------------------


def test_sync_complete_episodes_concatenate_every_actors_whole_episodes() -> None:
    """Each actor collects its share (4 frames) in whole episodes: actor 0 two of 3 steps,
    actor 1 one of 5; the gathered batch is flat, actor 0's episodes first."""
    batches = collect(True, 8, 24, batch_mode="complete_episodes")
    assert len(batches) == 2
    for batch in batches:
        assert batch.names == ["time"]
        assert batch.numel() == 11 >= 8
        episodes = episodes_of(batch)
        assert [episode.numel() for episode in episodes] == [3, 3, 5]
        for episode in episodes:
            assert_whole(episode)
        actors = [int(episode[keys.TRAJ_IDS][0]) % 2 for episode in episodes]
        assert actors == [0, 0, 1], "actor i draws ids i + 2k"


def test_async_complete_episodes_yield_each_actors_whole_episodes() -> None:
    batches = collect(False, 4, 24, batch_mode="complete_episodes")
    for actor, own in by_actor(batches).items():
        for batch in own:
            assert batch.names == ["time"]
            assert batch.numel() >= 4
            episodes = episodes_of(batch)
            assert [episode.numel() for episode in episodes] == ([3, 3] if actor == 0 else [5])
            for episode in episodes:
                assert_whole(episode)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_trajs_per_batch_gives_exactly_n_episodes_per_actor(sync: bool) -> None:
    """Padded batches of 2 episodes per actor; sync pads actor 0's 3-step rows to 5."""
    batches = collect(sync, 8, 32, trajs_per_batch=2)
    if sync:
        assert len(batches) == 2
        rows = [(batch, [3, 3, 5, 5]) for batch in batches]
    else:
        lengths_of = {0: [3, 3], 1: [5, 5]}
        rows = [
            (batch, lengths_of[actor]) for actor, own in by_actor(batches).items() for batch in own
        ]
    for batch, lengths in rows:
        assert batch.names == [None, "time"]
        assert batch.shape == torch.Size([len(lengths), max(lengths)])
        mask = batch[keys.COLLECTOR, "mask"]
        assert mask.sum(-1).tolist() == lengths
        for row, length in enumerate(lengths):
            assert not mask[row, length:].any()
            assert_whole(batch[row, :length])


def test_sync_refuses_actors_with_different_batch_layouts() -> None:
    message = r"different layouts \(\['cat', 'fixed-size'\].*sync=False"
    with pytest.raises(ValueError, match=message):
        RayCollector(
            MAKERS,
            frames_per_batch=8,
            collector_kwargs=[{"batch_mode": "complete_episodes"}, {}],
        )


# --- horizons -------------------------------------------------------------------------------------


def rows_of(batches: list[TensorDictBase], sync: bool) -> list[TensorDictBase]:
    """Each actor's run, in order, as one `[*env_batch, T]` TensorDict."""
    if sync:
        return list(torch.cat(batches, -1).unbind(0))
    return [torch.cat(own, -1) for _, own in sorted(by_actor(batches).items())]


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_soft_horizon_cuts_and_restarts_the_views_in_every_actor(sync: bool) -> None:
    """Horizon 4 on episodes of 100 steps: no reset, no done; truncated and a new trajectory
    every 4 steps, and the views restart there (the new trajectory's first observation)."""
    views = {"prev_obs": ViewRequirement(keys.OBSERVATION, shift=[-2, -1])}
    batches = collect(
        sync, 10 if sync else 5, 20, create_env_fn=plain_counting_env(100),
        num_collectors=2, max_frames_per_traj=4, soft_horizon=True, view_requirements=views,
    )  # fmt: skip
    for actor, row in enumerate(rows_of(batches, sync)):
        steps = row.numel()  # 10 per actor (sync); 5 per batch, 4 batches in all (async)
        assert steps >= 5
        assert row[keys.OBSERVATION].flatten().tolist() == [float(t) for t in range(steps)]
        assert not row[keys.NEXT, keys.DONE].any()
        truncated = [t % 4 == 3 for t in range(steps)]
        assert row[keys.NEXT, keys.TRUNCATED].flatten().tolist() == truncated
        assert row[keys.TRAJ_IDS].tolist() == [actor + 2 * (t // 4) for t in range(steps)]
        prev_obs = row["prev_obs"].squeeze(-1).tolist()
        assert prev_obs[:5] == [[0, 0], [0, 0], [0, 1], [1, 2], [4, 4]]
        starts = [t - t % 4 for t in range(steps)]  # where each step's trajectory began
        assert prev_obs == [[max(t - 2, s), max(t - 1, s)] for t, s in enumerate(starts)]


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_no_done_at_end_keeps_truncated_and_resets_in_every_actor(sync: bool) -> None:
    views = {"prev_reward": ViewRequirement(keys.REWARD, shift=-1)}
    batches = collect(
        sync, 16 if sync else 8, 32, create_env_fn=plain_counting_env(3), num_collectors=2,
        max_frames_per_traj=100, no_done_at_end=True, view_requirements=views,
    )  # fmt: skip
    for actor, row in enumerate(rows_of(batches, sync)):
        steps = row.numel()  # 16 per actor (sync); 8 per batch, 4 batches in all (async)
        assert steps >= 8
        assert not row[keys.NEXT, keys.DONE].any()
        assert not row[keys.NEXT, keys.TERMINATED].any()
        assert row[keys.OBSERVATION].flatten().tolist() == [float(t % 3) for t in range(steps)]
        truncated = [t % 3 == 2 for t in range(steps)]
        assert row[keys.NEXT, keys.TRUNCATED].flatten().tolist() == truncated
        assert row[keys.TRAJ_IDS].tolist() == [actor + 2 * (t // 3) for t in range(steps)]
        # the env still resets at an episode's end: the views restart there
        assert row["prev_reward"].flatten().tolist() == [float(t % 3 > 0) for t in range(steps)]


# --- trajectory views at inference ---------------------------------------------------------------


BATCHED_MAKER: Callable[[], Any] = functools.partial(counting_env, [3, 5], (2,))


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_actors_policies_read_and_batches_hold_the_views(sync: bool) -> None:
    """Batched env, episodes of 3 and 5 steps crossing batch boundaries: the values each
    actor's policy read and those in the batch equal the hand-computed views."""
    views = {name: VIEWS[name] for name in VIEW_NAMES}
    batches = collect(
        sync, 16 if sync else 8, 48, create_env_fn=BATCHED_MAKER, num_collectors=2,
        policy=echo_policy(VIEW_NAMES), view_requirements=views,
    )  # fmt: skip
    data = rows_of(batches, sync)
    for run in data:
        assert run.shape[-1] >= 8
        for name, requirement in views.items():
            expected = expected_view(run, requirement.data_col, requirement.shift)
            assert torch.equal(run[name], expected), name
            assert torch.equal(run[f"seen_{name}"], expected), name
    # by hand, sub-env 0 (episodes of 3, observations 10, 11, 12) of actor 0
    assert data[0]["obs_range"][0, :4].squeeze(-1).tolist() == [
        [10, 10, 10],
        [10, 10, 10],
        [10, 10, 11],
        [10, 10, 10],
    ]
    assert data[0]["reward_minus_one"][0, :4].flatten().tolist() == [0.0, 1.0, 1.0, 0.0]


def test_trajs_per_write_reaches_the_buffer_whole_episodes() -> None:
    """With a replay buffer, each actor's collector writes its episodes `trajs_per_write` at
    a time (actor 0 one at a time, actor 1 two; the chunking itself is tested against TorchRL
    locally): the buffer holds whole episodes only, from both actors."""
    from rlcollect.replay import LazyTensorStorage, RayReplayBuffer

    with RayReplayBuffer(storage=LazyTensorStorage(1000)) as buffer:
        collector = RayCollector(
            MAKERS,
            frames_per_batch=8,
            total_frames=32,
            trajs_per_batch=2,
            traj_format="cat",
            collector_kwargs=[{"trajs_per_write": 1}, {"trajs_per_write": 2}],
            replay_buffer=buffer,
        )
        with collector:
            batches = list(collector)
        stored = buffer[: len(buffer)]
    assert batches
    assert set(batches) == {None}  # the actors wrote their episodes
    episodes = episodes_of(stored)
    assert len(episodes) == 2 * len(batches)  # 2 whole episodes per actor batch
    assert {len(episode) for episode in episodes} == {3, 5}
    for episode in episodes:
        assert_whole(episode)

"""RLlib's batch modes and horizons, and TorchRL's `trajs_per_batch`, on real envs."""

from __future__ import annotations

import functools

import pytest
import torch
from tensordict import TensorDictBase

from rlcollect import Collector
from rlcollect.envs import GymEnv, SerialEnv
from rlcollect.testing import CountingEnv
from tests.collectors.policies import greedy_module
from tests.collectors.sampling.whole_episodes import assert_whole, episodes_of
from tests.collectors.single.torchrl_parity import assert_same_batches


def test_complete_episodes_of_98_steps_make_batches_of_196_frames() -> None:
    collector = Collector(
        CountingEnv(episode_length=98),
        None,
        frames_per_batch=100,
        total_frames=1000,
        batch_mode="complete_episodes",
    )
    batches = list(collector)
    collector.shutdown()
    assert [batch.numel() for batch in batches] == [196] * 5
    for batch in batches:
        assert batch.names == ["time"]
        assert batch.numel() >= 100
        for episode in episodes_of(batch):
            assert episode.numel() == 98
            assert_whole(episode)
    with pytest.raises(TypeError, match=r"no length"):
        len(collector)


def test_complete_episodes_keep_every_sub_envs_episodes_whole() -> None:
    env = CountingEnv(episode_length=[3, 7, 11], batch_size=(3,))
    collector = Collector(
        env, None, frames_per_batch=12, total_frames=240, batch_mode="complete_episodes"
    )
    lengths = []
    for batch in collector:
        assert batch.numel() >= 12
        for episode in episodes_of(batch):
            assert_whole(episode)
            lengths.append(episode.numel())
    collector.shutdown()
    assert {3, 7, 11} == set(lengths)
    # split_trajs gives the padded layout with a mask instead of the flat one.
    collector = Collector(
        SerialEnv(2, lambda: CountingEnv(episode_length=[3, 5], batch_size=(2,))),
        None,
        frames_per_batch=12,
        total_frames=48,
        batch_mode="complete_episodes",
        split_trajs=True,
    )
    batch = collector.next()
    collector.shutdown()
    mask = batch["collector", "mask"]
    assert batch.ndim == 2
    assert set(mask.sum(-1).tolist()) == {3, 5}
    assert int(mask.sum()) >= 12


def test_an_episode_assembled_across_3_batches_equals_one_collected_whole() -> None:
    def make_env() -> GymEnv:
        env = GymEnv("CartPole-v1")
        env.set_seed(11)
        return env

    pieces = Collector(
        make_env(), greedy_module(), frames_per_batch=8, total_frames=400, trajs_per_batch=1
    )
    assembled = pieces.next()
    pieces.shutdown()
    length = int(assembled["collector", "mask"].sum())
    assert length > 3 * 8, "the first episode spans at least 3 batches"
    whole = Collector(make_env(), greedy_module(), frames_per_batch=500, total_frames=500)
    reference = whole.next()[:length]
    whole.shutdown()
    assembled = assembled[0].exclude("collector")
    for key in reference.exclude("collector").keys(include_nested=True, leaves_only=True):
        assert torch.equal(assembled[key], reference[key]), key


@pytest.mark.parametrize("traj_format", ["padded", "cat"])
def test_trajs_per_batch_gives_torchrls_batches(traj_format: str) -> None:
    torchrl_envs = pytest.importorskip("torchrl.envs")
    torchrl_collectors = pytest.importorskip("torchrl.collectors")
    batches = []
    for collector_class, env in (
        (Collector, GymEnv("CartPole-v1")),
        (torchrl_collectors.Collector, torchrl_envs.GymEnv("CartPole-v1")),
    ):
        env.set_seed(3)
        collector = collector_class(
            env,
            greedy_module(),
            frames_per_batch=16,
            total_frames=400,
            trajs_per_batch=2,
            traj_format=traj_format,
        )
        batches.append(list(collector))
        collector.shutdown()
    ours, theirs = batches
    assert len(ours) == 2
    for batch in ours:
        if traj_format == "padded":
            assert batch.shape[0] == 2  # exactly N episodes
            assert batch.names == [None, "time"]  # TorchRL drops the name; we keep it
        else:
            assert len(episodes_of(batch)) == 2
    assert_same_batches(ours, theirs, compare_names=traj_format == "cat")


class Recorder:
    """A replay buffer stand-in that keeps every extend (to count and compare the writes)."""

    def __init__(self) -> None:
        self.writes: list[TensorDictBase] = []

    def extend(self, data: TensorDictBase) -> None:
        self.writes.append(data.clone())


@pytest.mark.parametrize("trajs_per_write", [None, 2])
def test_trajs_per_write_writes_whole_episodes_as_torchrl_does(trajs_per_write: int) -> None:
    torchrl_envs = pytest.importorskip("torchrl.envs")
    torchrl_collectors = pytest.importorskip("torchrl.collectors")
    torchrl_data = pytest.importorskip("torchrl.data")
    ours_buffer = Recorder()
    theirs_buffer = torchrl_data.ReplayBuffer(storage=torchrl_data.LazyTensorStorage(10_000))
    for collector_class, env, buffer in (
        (Collector, GymEnv("CartPole-v1"), ours_buffer),
        (torchrl_collectors.Collector, torchrl_envs.GymEnv("CartPole-v1"), theirs_buffer),
    ):
        env.set_seed(3)
        collector = collector_class(
            env,
            greedy_module(),
            frames_per_batch=16,
            total_frames=400,
            trajs_per_batch=2,
            trajs_per_write=trajs_per_write,
            replay_buffer=buffer,
        )
        for _ in collector:
            pass
        collector.shutdown()
    written = torch.cat(ours_buffer.writes, 0)
    assert_same_batches([written], [theirs_buffer[:]], compare_names=False)
    for write in ours_buffer.writes:
        episodes = episodes_of(write)
        assert len(episodes) <= (trajs_per_write or len(episodes))
        for episode in episodes:
            assert bool(episode["next", "done"][-1])


def test_whole_episodes_refuse_options_that_cut_them() -> None:
    cases = [
        ({"batch_mode": "complete"}, r"batch_mode must be one of"),
        ({"trajs_per_batch": 0}, r"trajs_per_batch must be a positive integer; got 0"),
        ({"traj_format": "cat"}, r"traj_format='cat' shapes the batches of trajs_per_batch"),
        ({"trajs_per_batch": 2, "traj_format": "flat"}, r"traj_format must be .padded. or .cat."),
        ({"trajs_per_batch": 2, "trajs_per_write": 2}, r"pass replay_buffer"),
        (
            {"trajs_per_batch": 2, "batch_mode": "truncate_episodes"},
            r"batch_mode='truncate_episodes' cuts them",
        ),
        (
            {"batch_mode": "complete_episodes", "reset_at_each_iter": True},
            r"reset_at_each_iter=True cannot be used",
        ),
        (
            {"batch_mode": "complete_episodes", "set_truncated": True},
            r"set_truncated=True cannot be used",
        ),
        ({"trajs_per_batch": 2, "split_trajs": True}, r"already one row per trajectory"),
        (
            {"batch_mode": "complete_episodes", "no_done_at_end": True},
            r"no_done_at_end=True cannot be used",
        ),
    ]
    for options, message in cases:
        with pytest.raises(ValueError, match=message):
            Collector(CountingEnv(episode_length=4), None, frames_per_batch=8, **options)
    collector = Collector(
        CountingEnv(episode_length=4), None, frames_per_batch=8, trajs_per_batch=2
    )
    rollout = collector.layout.carrier.clone()
    with pytest.raises(Exception, match=r"cannot hold batches of whole episodes"):
        collector.collect_rollout(rollout)
    collector.shutdown()


def test_soft_horizon_cuts_without_a_reset_or_a_done() -> None:
    collector = Collector(
        CountingEnv(episode_length=100),
        None,
        frames_per_batch=10,
        total_frames=10,
        max_frames_per_traj=4,
        soft_horizon=True,
    )
    batch = collector.next()
    stats = collector.stats()
    collector.shutdown()
    # The env is not reset: its count goes on through the horizon.
    assert batch["observation"].flatten().tolist() == [float(i) for i in range(10)]
    truncated = batch["next", "truncated"].flatten().tolist()
    assert truncated == [False, False, False, True] * 2 + [False, False]
    assert not bool(batch["next", "done"].any())
    assert not bool(batch["next", "terminated"].any())
    # A new trajectory (and a new step count) starts after each cut.
    assert batch["collector", "traj_ids"].tolist() == [0] * 4 + [1] * 4 + [2] * 2
    assert batch["next", "step_count"].flatten().tolist() == [1, 2, 3, 4] * 2 + [1, 2]
    assert stats["episodes"] == 2


def test_hard_horizon_resets_and_is_done() -> None:
    collector = Collector(
        CountingEnv(episode_length=100),
        None,
        frames_per_batch=10,
        total_frames=10,
        max_frames_per_traj=4,
    )
    batch = collector.next()
    collector.shutdown()
    assert batch["observation"].flatten().tolist() == [0.0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert batch["next", "done"].flatten().tolist() == [False, False, False, True] * 2 + [
        False,
        False,
    ]


def test_no_done_at_end_never_writes_done_and_still_resets() -> None:
    collector = Collector(
        CountingEnv(episode_length=3),
        None,
        frames_per_batch=8,
        total_frames=16,
        no_done_at_end=True,
        max_frames_per_traj=100,
    )
    first, second = list(collector)
    collector.shutdown()
    for batch in (first, second):
        assert not bool(batch["next", "done"].any())
        assert not bool(batch["next", "terminated"].any())
    # Episode ends are still where they were: the env resets, ids change, truncated marks them.
    assert first["observation"].flatten().tolist() == [0.0, 1, 2, 0, 1, 2, 0, 1]
    assert first["next", "truncated"].flatten().tolist() == [False, False, True] * 2 + [
        False,
        False,
    ]
    assert first["collector", "traj_ids"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    assert second["collector", "traj_ids"].tolist()[0] == 2


def test_horizon_options_are_checked() -> None:
    with pytest.raises(ValueError, match=r"soft_horizon=True .* set max_frames_per_traj"):
        Collector(CountingEnv(), None, frames_per_batch=8, soft_horizon=True)
    with pytest.raises(TypeError, match=r"no_done_at_end must be True or False; got 'yes'"):
        Collector(CountingEnv(), None, frames_per_batch=8, no_done_at_end="yes")


def counting_env_of_lengths() -> CountingEnv:
    return CountingEnv(episode_length=[3, 5], batch_size=(2,))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("options", "layout"),
    [
        ({"batch_mode": "complete_episodes"}, "cat"),
        ({"trajs_per_batch": 3, "traj_format": "cat"}, "cat"),
        ({"trajs_per_batch": 3}, "padded"),
    ],
)
def test_multi_process_workers_keep_every_episode_whole(
    options: dict, layout: str, no_leftover_children: None
) -> None:
    from rlcollect import MultiAsyncCollector, MultiSyncCollector

    sync = MultiSyncCollector(
        [counting_env_of_lengths, counting_env_of_lengths],
        None,
        frames_per_batch=16,
        total_frames=96,
        **options,
    )
    batches = list(sync)
    with pytest.raises(TypeError, match=r"no length"):
        len(sync)
    sync.shutdown()
    asynchronous = MultiAsyncCollector(
        [counting_env_of_lengths, counting_env_of_lengths],
        None,
        frames_per_batch=16,
        total_frames=96,
        track_worker_id=True,  # tells its batches from the sync ones below
        **options,
    )
    batches += list(asynchronous)
    asynchronous.shutdown()
    assert len(batches) >= 4
    for batch in batches:
        if layout == "padded":
            assert batch.names == [None, "time"]
            rows = batch["collector", "mask"].sum(-1).tolist()
            assert set(rows) <= {3, 5}
            episodes = [batch[i, :length] for i, length in enumerate(rows)]
        else:
            assert batch.names == ["time"]
            episodes = episodes_of(batch)
        if "trajs_per_batch" in options:
            # N in all, as TorchRL counts them: the sync batches' episodes come from both
            # workers (each batches ceil(N / W)), the async ones' from one.
            assert len(episodes) == 3
        for episode in episodes:
            assert_whole(episode)
            assert episode.numel() in (3, 5)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("horizon", ["soft_horizon", "no_done_at_end"])
def test_multi_async_workers_apply_the_horizons(horizon: str, no_leftover_children: None) -> None:
    """Soft horizon 4 on episodes of 100 steps: no reset, no done, truncated and a new id every
    4 steps. no_done_at_end on episodes of 3: resets, truncated at the ends, never done."""
    from rlcollect import MultiAsyncCollector

    soft = horizon == "soft_horizon"
    with MultiAsyncCollector(
        [functools.partial(CountingEnv, episode_length=100 if soft else 3)] * 2,
        None,
        frames_per_batch=6,
        total_frames=48,
        max_frames_per_traj=4 if soft else 100,
        track_worker_id=True,
        **{horizon: True},
    ) as collector:
        batches = list(collector)
    runs: dict[int, list[TensorDictBase]] = {}
    for batch in batches:
        runs.setdefault(int(batch["collector", "worker_id"][0]), []).append(batch)
    assert sorted(runs) == [0, 1]
    length = 4 if soft else 3
    seen: set[int] = set()
    for own in runs.values():
        run = torch.cat(own, 0)  # the worker's batches, in order
        steps = run.numel()
        assert not bool(run["next", "done"].any())
        assert not bool(run["next", "terminated"].any())
        observations = [float(t if soft else t % 3) for t in range(steps)]
        assert run["observation"].flatten().tolist() == observations
        truncated = [t % length == length - 1 for t in range(steps)]
        assert run["next", "truncated"].flatten().tolist() == truncated
        ids = run["collector", "traj_ids"]
        assert torch.equal(ids[1:] != ids[:-1], torch.tensor(truncated[:-1]))
        assert not seen & set(ids.tolist()), "ids unique across workers"
        seen |= set(ids.tolist())

"""store_obs_once=True: observations stored once; `transition_view` gives the batch back."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from rlcollect import (
    Collector,
    GymEnv,
    LazyMemmapStorage,
    LazyTensorStorage,
    MultiAsyncCollector,
    MultiSyncCollector,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SerialEnv,
    compact_batch,
    keys,
    transition_view,
)
from rlcollect.batch.compact import is_compact
from rlcollect.testing import CountingEnv
from tests.collectors.policies import greedy_module

PIXELS = (84, 84, 3)


class PixelEnv(gym.Env):
    """A Gymnasium env with an 84x84x3 uint8 observation (a frame counter painted into the
    image) whose episodes last `episode_length` steps: the Atari-sized case of store_obs_once."""

    metadata: dict[str, Any] = {}

    def __init__(self, episode_length: int = 30) -> None:
        self.observation_space = gym.spaces.Box(0, 255, PIXELS, np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.episode_length = episode_length
        self.count = 0
        self.episode = 0

    def _frame(self) -> np.ndarray:
        frame = np.full(PIXELS, self.count % 256, dtype=np.uint8)
        frame[0, 0, 0] = self.episode % 256  # terminal and reset frames always differ
        return frame

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.count, self.episode = 0, self.episode + 1
        return self._frame(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.count += 1
        return self._frame(), 1.0, self.count >= self.episode_length, False, {}


def pixel_env(episode_length: int = 30) -> GymEnv:
    return GymEnv(PixelEnv(episode_length))


def cartpole() -> GymEnv:
    return GymEnv("CartPole-v1")


def assert_same_batch(view: TensorDictBase, standard: TensorDictBase) -> None:
    """Frame for frame: the same batch size, names, keys, dtypes and values."""
    assert view.batch_size == standard.batch_size
    assert view.names == standard.names
    view_keys = set(view.keys(include_nested=True, leaves_only=True))
    assert view_keys == set(standard.keys(include_nested=True, leaves_only=True))
    for key in view_keys:
        assert view[key].dtype == standard[key].dtype, key
        assert torch.equal(view[key], standard[key]), key
    for key, value in standard.items(include_nested=True):
        if isinstance(value, TensorDictBase):
            assert view[key].batch_size == value.batch_size, key


def collect(make: Callable[..., Any], store_obs_once: bool, batches: int, **options: Any) -> list:
    """`batches` batches of a seeded collector (one run per call, same seed every time)."""
    torch.manual_seed(0)
    collector = make(store_obs_once=store_obs_once, **options)
    try:
        collector.set_seed(0)
        return list(itertools.islice(collector, batches))
    finally:
        collector.shutdown()


def assert_compact_runs_match(compact: Iterable, standard: Iterable) -> None:
    for compact_batch_, standard_batch in zip(compact, standard, strict=True):
        assert is_compact(compact_batch_)
        assert_same_batch(transition_view(compact_batch_), standard_batch)


def ends(batches: Iterable[TensorDictBase]) -> tuple[bool, bool]:
    """Whether an episode ended inside a batch (before its last step), and whether one ran
    across a batch boundary (a batch starts inside a trajectory of the batch before)."""
    inside = across = False
    previous = None
    for batch in batches:
        done = batch["next", "done"].squeeze(-1)
        inside |= bool(done[..., :-1].any())
        if previous is not None:
            last = previous[keys.TRAJ_IDS][..., -1]
            across |= bool((batch[keys.TRAJ_IDS][..., 0] == last).any())
        previous = batch
    return inside, across


# --- the layout -----------------------------------------------------------------------------


def test_compact_layout_of_a_batched_counting_env() -> None:
    """Counting envs make every slot predictable: T + 1 observations per env, the final
    observations of the episodes ending inside the batch, and their steps."""
    env = CountingEnv(episode_length=(3, 5), batch_size=(2,))
    collector = Collector(env, None, frames_per_batch=14, total_frames=28, store_obs_once=True)
    first, second = list(collector)
    assert first.batch_size == torch.Size([2])
    assert first["observation"].squeeze(-1).tolist() == [
        [0, 1, 2, 0, 1, 2, 0, 1],
        [0, 1, 2, 3, 4, 0, 1, 2],
    ]
    assert first["action"].shape == (2, 7)
    assert first["next", "reward"].shape == (2, 7, 1)
    assert ("next", "observation") not in first.keys(include_nested=True)
    # env 0 ends at steps 2 and 5, env 1 at step 4 (step 6 is the last: its next observation
    # is slot T); -1 pads env 1's row.
    assert first["final", "step"].tolist() == [[2, 5], [4, -1]]
    assert first["final", "next", "observation"].squeeze(-1).tolist() == [[3, 3], [5, 0]]
    # The second batch goes on where the first stopped.
    assert second["observation"][:, 0].tolist() == first["observation"][:, -1].tolist()


def test_slot_t_is_the_final_observation_when_the_last_step_ends() -> None:
    def make(**options: Any) -> Collector:
        return Collector(CountingEnv(episode_length=4), None, frames_per_batch=4, **options)

    (batch,) = collect(make, store_obs_once=True, batches=1)
    assert batch["observation"].squeeze(-1).tolist() == [0, 1, 2, 3, 4]
    assert batch["final", "step"].shape == (0,)
    assert_compact_runs_match([batch], collect(make, store_obs_once=False, batches=1))


# --- transition_view equals the standard batch, frame for frame -----------------------------


@pytest.mark.parametrize("env_batch", [(), (3,), (2, 2)])
def test_counting_env_frame_for_frame(env_batch: tuple[int, ...]) -> None:
    lengths = torch.tensor([3, 5, 7, 2])[: max(1, int(np.prod(env_batch)))].reshape(env_batch)

    def make(**options: Any) -> Collector:
        env = CountingEnv(episode_length=lengths, batch_size=env_batch)
        return Collector(env, None, frames_per_batch=7 * lengths.numel(), **options)

    standard = collect(make, store_obs_once=False, batches=6)
    assert ends(standard) == (True, True)
    assert_compact_runs_match(collect(make, store_obs_once=True, batches=6), standard)


@pytest.mark.parametrize(
    "make_env",
    [cartpole, functools.partial(SerialEnv, 3, cartpole)],
    ids=["GymEnv", "SerialEnv(3)"],
)
def test_cartpole_frame_for_frame(make_env: Callable[[], Any]) -> None:
    def make(**options: Any) -> Collector:
        return Collector(make_env, greedy_module(), frames_per_batch=60, **options)

    standard = collect(make, store_obs_once=False, batches=8)
    assert ends(standard) == (True, True)
    assert_compact_runs_match(collect(make, store_obs_once=True, batches=8), standard)


def test_truncation_and_step_counts_frame_for_frame() -> None:
    """A horizon truncates inside batches; the step count is compacted like an observation."""

    def make(**options: Any) -> Collector:
        return Collector(
            cartpole, greedy_module(), frames_per_batch=25, max_frames_per_traj=9, **options
        )

    standard = collect(make, store_obs_once=False, batches=4)
    assert bool(standard[0]["next", "truncated"][:-1].any())
    compact = collect(make, store_obs_once=True, batches=4)
    assert ("next", "step_count") not in compact[0].keys(include_nested=True)
    assert compact[0]["step_count"].shape == (26, 1)
    assert_compact_runs_match(compact, standard)


@pytest.mark.parametrize("options", [{"split_trajs": True}, {"postproc": lambda b: b}])
def test_pipeline_options_frame_for_frame(options: dict[str, Any]) -> None:
    """With split_trajs the compact batch holds trajectories (`[num_trajs]`) and
    transition_view gives the split batch back, mask included; a postproc sees the full
    batch and its result is compacted."""

    def make(**more: Any) -> Collector:
        env = CountingEnv(episode_length=(3, 5), batch_size=(2,))
        return Collector(env, None, frames_per_batch=14, **options, **more)

    standard = collect(make, store_obs_once=False, batches=3)
    assert_compact_runs_match(collect(make, store_obs_once=True, batches=3), standard)


def test_postproc_sees_the_full_batch_and_the_hook_the_compact_one() -> None:
    seen: list[str] = []

    def postproc(batch: TensorDictBase) -> TensorDictBase:
        seen.append("postproc:" + str(("next", "observation") in batch.keys(True)))
        return batch

    def hook(batch: TensorDictBase) -> None:
        seen.append("hook:" + str(is_compact(batch)))

    env = CountingEnv(episode_length=3)
    collector = Collector(
        env,
        None,
        frames_per_batch=5,
        total_frames=5,
        store_obs_once=True,
        postproc=postproc,
        post_collect_hook=hook,
    )
    list(collector)
    assert seen == ["postproc:True", "hook:True"]


# --- memory ---------------------------------------------------------------------------------


@pytest.mark.parametrize("env_batch", [1, 4])
def test_pixel_batches_take_at_most_55_percent_of_the_bytes(env_batch: int) -> None:
    """84x84x3 uint8 observations, episodes of 30 steps ending inside 100-step batches."""

    def make(**options: Any) -> Collector:
        env = pixel_env() if env_batch == 1 else SerialEnv(env_batch, pixel_env)
        return Collector(env, None, frames_per_batch=100 * env_batch, **options)

    standard = collect(make, store_obs_once=False, batches=3)
    compact = collect(make, store_obs_once=True, batches=3)
    assert_compact_runs_match(compact, standard)
    for compact_, standard_ in zip(compact, standard, strict=True):
        assert compact_["final", "step"].shape[-1] >= 3  # 3 or 4 episodes end in every row
        ratio = compact_.bytes() / standard_.bytes()
        assert ratio <= 0.55, ratio


def test_transition_view_shares_storage_without_ends_inside() -> None:
    env = CountingEnv(episode_length=100)
    (batch,) = Collector(env, None, frames_per_batch=10, total_frames=10, store_obs_once=True)
    view = transition_view(batch)
    storage = batch["observation"].untyped_storage().data_ptr()
    assert view["observation"].untyped_storage().data_ptr() == storage
    assert view["next", "observation"].untyped_storage().data_ptr() == storage
    assert view["action"].data_ptr() == batch["action"].data_ptr()


# --- multi-process collectors ---------------------------------------------------------------


def counting_pair() -> CountingEnv:
    return CountingEnv(episode_length=(3, 5), batch_size=(2,))


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
@pytest.mark.parametrize("cat_results", ["stack", 0, -1])
def test_multi_sync_frame_for_frame(cat_results: Any) -> None:
    def make(**options: Any) -> MultiSyncCollector:
        return MultiSyncCollector(
            functools.partial(SerialEnv, 2, cartpole),
            greedy_module(),
            num_workers=2,
            frames_per_batch=80,
            cat_results=cat_results,
            **options,
        )

    standard = collect(make, store_obs_once=False, batches=4)
    assert ends(standard)[0]  # with cat_results=-1 time holds one worker after the other
    compact = collect(make, store_obs_once=True, batches=4)
    assert compact[0].batch_size == standard[0].batch_size[:-1]
    assert_compact_runs_match(compact, standard)


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
def test_multi_async_frame_for_frame() -> None:
    def make(**options: Any) -> MultiAsyncCollector:
        return MultiAsyncCollector([counting_pair], None, frames_per_batch=14, **options)

    standard = collect(make, store_obs_once=False, batches=3)
    assert_compact_runs_match(collect(make, store_obs_once=True, batches=3), standard)


# --- replay buffers -------------------------------------------------------------------------


@pytest.mark.parametrize("storage", [LazyTensorStorage, LazyMemmapStorage])
def test_replay_buffer_stores_the_transitions_of_compact_batches(
    storage: Callable[[int], Any],
) -> None:
    def make(**options: Any) -> Collector:
        return Collector(
            functools.partial(SerialEnv, 2, pixel_env, create_env_kwargs={"episode_length": 7}),
            None,
            frames_per_batch=20,
            **options,
        )

    standard = collect(make, store_obs_once=False, batches=3)
    compact = collect(make, store_obs_once=True, batches=3)
    full = ReplayBuffer(storage=storage(100), batch_size=10)
    small = ReplayBuffer(storage=storage(100), batch_size=10, sampler=SamplerWithoutReplacement())
    for standard_, compact_ in zip(standard, compact, strict=True):
        assert torch.equal(full.extend(standard_), small.extend(compact_))
    assert len(small) == len(full) == 60
    assert_same_batch(small.storage[:], full.storage[:])
    sample = small.sample()
    assert sample["next", "observation"].shape == (10, *PIXELS)
    stored = full[sample["index"]]
    assert torch.equal(sample["next", "observation"], stored["next", "observation"])


@pytest.mark.parametrize("store_obs_once", [False, True])
def test_collector_extends_a_replay_buffer_with_compact_batches(store_obs_once: bool) -> None:
    def filled(store_obs_once: bool) -> ReplayBuffer:
        torch.manual_seed(0)  # the same random actions
        buffer = ReplayBuffer(storage=LazyTensorStorage(100))
        env = CountingEnv(episode_length=3, batch_size=(2,))
        collector = Collector(
            env,
            None,
            frames_per_batch=10,
            total_frames=30,
            replay_buffer=buffer,
            store_obs_once=store_obs_once,
        )
        assert list(collector) == [None] * 3
        return buffer

    buffer, reference = filled(store_obs_once), filled(False)
    assert len(buffer) == 30
    assert_same_batch(buffer.storage[:], reference.storage[:])


# --- compact_batch on any batch ---------------------------------------------------------------


def test_compaction_is_bitwise_lossless_for_any_next_observation() -> None:
    """Next observations unrelated to the following root (n-step targets, NaN, -0.0): every
    step keeps its own, and the round trip is exact bit for bit."""
    generator = torch.Generator().manual_seed(0)
    root = torch.randn(3, 6, 2, generator=generator)
    after = torch.randn(3, 6, 2, generator=generator)
    after[0, 1, 0], after[1, 2, 1] = float("nan"), -0.0
    root[1, 3, 1] = 0.0
    after[2] = torch.cat([root[2, 1:], after[2, -1:]])  # row 2 chains: no final needed
    batch = TensorDict(
        {"observation": root, "next": {"observation": after, "reward": torch.ones(3, 6, 1)}},
        batch_size=[3, 6],
        names=[None, "time"],
    )
    compact = compact_batch(batch)
    assert (compact["final", "step"] >= 0).sum(-1).tolist() == [5, 5, 0]
    view = transition_view(compact)
    for key in (("observation",), ("next", "observation")):
        assert torch.equal(view[key].view(torch.int32), batch[key].view(torch.int32))


def test_nested_observations_and_groups_with_more_batch_dims() -> None:
    """A nested observation (a Dict space) is compacted; a multi-agent group `[*B, T, n]`
    keeps its own batch size and its observations; the round trip restores both."""
    generator = torch.Generator().manual_seed(0)
    steps = torch.arange(12.0).reshape(2, 6, 1)

    def frames(shift: float) -> TensorDict:
        group = TensorDict(
            {"observation": torch.randn(2, 6, 4, 2, generator=generator)}, batch_size=[2, 6, 4]
        )
        return TensorDict(
            {"sensors": {"camera": steps + shift}, "agents": group}, batch_size=[2, 6]
        )

    batch = frames(0.0)
    batch.set("next", frames(1.0))
    batch.set(("next", "reward"), torch.ones(2, 6, 1))
    batch["next", "sensors", "camera"][0, 2] = -1.0  # an episode end inside row 0
    batch.names = [None, "time"]
    compact = compact_batch(batch)
    assert compact["sensors", "camera"].shape == (2, 7, 1)
    assert compact["agents"].batch_size == (2, 6, 4)
    assert ("next", "agents", "observation") in compact.keys(include_nested=True)
    assert compact["final", "step"].tolist() == [[2], [-1]]
    assert_same_batch(transition_view(compact), batch)


def test_multi_agent_env_frame_for_frame() -> None:
    pytest.importorskip("mpe2")
    from tests.envs.spread_agents import greedy_agents, spread_env

    def make(**options: Any) -> Collector:
        return Collector(spread_env(), greedy_agents(), frames_per_batch=25, **options)

    standard = collect(make, store_obs_once=False, batches=3)
    assert_compact_runs_match(collect(make, store_obs_once=True, batches=3), standard)


def test_compact_batches_stack_and_index_by_env() -> None:
    env = CountingEnv(episode_length=(3, 5), batch_size=(2,))
    first, second = Collector(env, None, frames_per_batch=14, total_frames=28, store_obs_once=True)
    assert_same_batch(transition_view(first[1]), transition_view(first)[1])
    stacked = torch.stack([first, second])
    assert_same_batch(
        transition_view(stacked), torch.stack([transition_view(first), transition_view(second)])
    )
    long_episodes = CountingEnv(episode_length=100, batch_size=(2,))
    (without_ends,) = Collector(
        long_episodes, None, frames_per_batch=14, total_frames=14, store_obs_once=True
    )
    with pytest.raises(RuntimeError):  # rows with another number of final observations
        torch.stack([first, without_ends])


def test_a_rollout_keeps_its_transition_view() -> None:
    rollout = TensorDict({"x": torch.arange(6).reshape(2, 3)}, [2, 3])
    assert transition_view(rollout)["x"].tolist() == [[0, 1], [3, 4]]
    with pytest.raises(ValueError, match="compact batch, or a rollout"):
        transition_view(TensorDict({}, []))


# --- validation -----------------------------------------------------------------------------


def test_store_obs_once_refuses_return_same_td() -> None:
    with pytest.raises(ValueError, match="drop return_same_td=True or store_obs_once=True"):
        Collector(CountingEnv(), None, frames_per_batch=4, store_obs_once=True, return_same_td=True)


def test_store_obs_once_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="store_obs_once must be True or False"):
        Collector(CountingEnv(), None, frames_per_batch=4, store_obs_once="yes")


def test_compact_batch_needs_a_time_dim() -> None:
    with pytest.raises(ValueError, match=r"\[\*env_batch, T\]"):
        compact_batch(TensorDict({"observation": torch.zeros(1)}, []))

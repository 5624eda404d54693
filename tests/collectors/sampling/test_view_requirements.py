"""Trajectory views at inference (RLlib's ViewRequirement): what the policy reads, what the
batch holds, at episode starts, episode ends and batch boundaries."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

from rlcollect import Collector, ViewRequirement, keys
from rlcollect.collectors import MultiAsyncCollector, MultiSyncCollector
from rlcollect.envs import SerialEnv
from rlcollect.envs.specs import Bounded
from rlcollect.testing import CountingEnv, TensorDictCountingEnv
from tests.collectors.sampling.trajectory_views import (
    VIEWS,
    counting_env,
    echo_policy,
    expected_view,
)


def serial_counting_env() -> SerialEnv:
    return SerialEnv(3, functools.partial(counting_env, 4))


def serial_of_batched_counting_env() -> SerialEnv:
    """Env batch `[2, 2]`, episodes of 3 and 5 steps (ends staggered)."""
    return SerialEnv(2, functools.partial(counting_env, [3, 5], (2,)))


class Recorder:
    """A policy that records what it reads at every step: action = (observation + 1) % 2."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.calls: list[dict[str, torch.Tensor]] = []

    def __call__(self, observation: torch.Tensor, *views: torch.Tensor) -> torch.Tensor:
        self.calls.append(dict(zip(self.names, (view.clone() for view in views), strict=True)))
        return (observation.squeeze(-1).long() + 1) % 2

    def module(self) -> TensorDictModule:
        return TensorDictModule(self, in_keys=[keys.OBSERVATION, *self.names], out_keys=["action"])

    def received(self, name: str, frames: int, time_dim: int) -> torch.Tensor:
        """What the policy read under `name` at the last `frames` steps, time at `time_dim`."""
        return torch.stack([call[name] for call in self.calls[-frames:]], dim=time_dim)


def collect_all(collector: Collector) -> TensorDictBase:
    return torch.cat(list(collector), dim=-1)


# --- values: the policy and the batch -------------------------------------------------------------


ENVS: dict[str, Callable[[], object]] = {
    "single": counting_env,
    "serial": serial_counting_env,
    "serial_of_batched": serial_of_batched_counting_env,
    "batched": functools.partial(counting_env, [3, 5], (2,)),
}


@pytest.mark.parametrize("env_name", list(ENVS))
def test_policy_reads_and_batch_holds_the_views(env_name: str) -> None:
    env = ENVS[env_name]()
    recorder = Recorder(list(VIEWS))
    collector = Collector(
        env, recorder.module(), frames_per_batch=12, total_frames=60, view_requirements=VIEWS
    )
    data = collect_all(collector)  # 5 batches: episodes of 3 and 5 steps cross every boundary
    time_dim = data.ndim - 1
    for name, requirement in VIEWS.items():
        expected = expected_view(data, requirement.data_col, requirement.shift)
        assert torch.equal(data[name], expected), name
        received = recorder.received(name, data.shape[-1], time_dim)
        assert torch.equal(received, expected), name
    collector.shutdown()


def test_single_env_values_by_hand() -> None:
    """Episodes of 5 steps (observations 10..14), batches of 4: episodes start at steps 0, 5
    and 10, end at 4 and 9; batch 2 starts at step 4, inside the first episode."""
    views = {name: VIEWS[name] for name in ("obs_range", "action_pair", "reward_minus_one")}
    recorder = Recorder(list(views))
    collector = Collector(
        counting_env(5), recorder.module(), frames_per_batch=4, total_frames=12,
        view_requirements=views,
    )  # fmt: skip
    batches = list(collector)
    by_step = {  # episode step k -> (obs "-3:-1", action [-2, -1], reward -1)
        0: ([10, 10, 10], [0, 0], 0.0),
        1: ([10, 10, 10], [0, 1], 1.0),
        2: ([10, 10, 11], [1, 0], 1.0),
        3: ([10, 11, 12], [0, 1], 1.0),
        4: ([11, 12, 13], [1, 0], 1.0),
    }
    steps = [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]
    for index, batch in enumerate(batches):
        for t in range(4):
            observations, actions, reward = by_step[steps[4 * index + t]]
            assert batch["obs_range"][t].squeeze(-1).tolist() == observations, (index, t)
            assert batch["action_pair"][t].tolist() == actions, (index, t)
            assert batch["reward_minus_one"][t].tolist() == [reward], (index, t)
    # the policy read the same, batch boundaries included (batch 2 starts at episode step 4)
    assert recorder.calls[-8]["obs_range"].squeeze(-1).tolist() == [11, 12, 13]
    assert recorder.calls[-8]["action_pair"].tolist() == [1, 0]
    collector.shutdown()


def test_episode_spanning_batches_sees_its_history() -> None:
    """An episode of 20 steps over batches of 3: the last 4 observations always are real."""
    views = {"last_obs": ViewRequirement(keys.OBSERVATION, shift="-3:0")}
    collector = Collector(
        counting_env(20), None, frames_per_batch=3, total_frames=18, view_requirements=views
    )
    data = collect_all(collector)
    window = data["last_obs"].squeeze(-1)
    assert window[0].tolist() == [10, 10, 10, 10]
    for t in range(3, 18):
        assert window[t].tolist() == [7 + t, 8 + t, 9 + t, 10 + t]


def test_reset_at_each_iter_restarts_the_views() -> None:
    views = {"prev_obs": ViewRequirement(keys.OBSERVATION, shift=[-2, -1])}
    collector = Collector(
        counting_env(20), None, frames_per_batch=3, total_frames=9, view_requirements=views,
        reset_at_each_iter=True,
    )  # fmt: skip
    for batch in collector:
        assert batch["prev_obs"].squeeze(-1).tolist() == [[10, 10], [10, 10], [10, 11]]


def test_soft_horizon_restarts_the_views_without_a_reset() -> None:
    """Horizon 3 on episodes of 100 steps, batches of 6: trajectories start at steps 0, 3, 6
    and 9 without a reset (observations 10, 11, ... go on), the cut at step 5 on a batch's
    last step. The views restart at each cut, exactly as at a reset."""
    views = {
        "obs_pair": ViewRequirement(keys.OBSERVATION, shift="-2:-1"),
        "prev_action": ViewRequirement(keys.ACTION, shift=-1),
        "prev_reward": ViewRequirement(keys.REWARD, shift=-1),
    }
    recorder = Recorder(list(views))
    collector = Collector(
        counting_env(100), recorder.module(), frames_per_batch=6, total_frames=12,
        max_frames_per_traj=3, soft_horizon=True, view_requirements=views,
    )  # fmt: skip
    data = collect_all(collector)
    collector.shutdown()
    assert data["observation"].flatten().tolist() == [10.0 + t for t in range(12)]
    assert data["next", "truncated"].flatten().tolist() == [False, False, True] * 4
    assert not bool(data["next", "done"].any())
    assert data["action"].tolist() == [1, 0] * 6
    obs_pair = [[10, 10], [10, 10], [10, 11], [13, 13], [13, 13], [13, 14]]  # batch 1
    obs_pair += [[16, 16], [16, 16], [16, 17], [19, 19], [19, 19], [19, 20]]  # batch 2
    expected = {
        "obs_pair": obs_pair,
        # zero at every start, where the last action (1 at steps 2 and 8) would otherwise be
        "prev_action": [0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1],
        "prev_reward": [0.0, 1, 1] * 4,
    }
    for name, values in expected.items():
        assert data[name].squeeze(-1).tolist() == values, name
        assert recorder.received(name, 12, 0).squeeze(-1).tolist() == values, name


def test_space_zero_pads_other_views() -> None:
    views = {"prev_reward": ViewRequirement("reward", shift=-1, space=Bounded(5.0, 6.0, (1,)))}
    collector = Collector(
        counting_env(3), None, frames_per_batch=6, total_frames=6, view_requirements=views
    )
    batch = next(iter(collector))
    assert batch["prev_reward"].squeeze(-1).tolist() == [5.0, 1.0, 1.0, 5.0, 1.0, 1.0]


def test_views_continue_through_collect_rollout() -> None:
    views = {"prev_obs": ViewRequirement(keys.OBSERVATION, shift="-2:-1")}
    collector = Collector(
        counting_env(20), None, frames_per_batch=3, total_frames=12, view_requirements=views
    )
    first = collector.next()
    rollout = collector.collect_rollout(TensorDict({}, batch_size=[4]))
    last = collector.next()
    assert first["prev_obs"][-1].squeeze(-1).tolist() == [10, 11]
    assert rollout["prev_obs"][:3].squeeze(-1).tolist() == [[11, 12], [12, 13], [13, 14]]
    assert last["prev_obs"][0].squeeze(-1).tolist() == [14, 15]


def test_tensordict_first_env_and_plain_module_reading_a_view() -> None:
    """A plain module's forward may name a view; a TensorDict-first env gets the same views."""

    class PreviousActionPolicy(nn.Module):
        view_requirements = {"prev_action": ViewRequirement("action", shift=-1)}

        def forward(self, observation: torch.Tensor, prev_action: torch.Tensor) -> torch.Tensor:
            return 1 - prev_action

    env = TensorDictCountingEnv(episode_length=3, batch_size=(2,))
    collector = Collector(env, PreviousActionPolicy(), frames_per_batch=16, total_frames=16)
    batch = next(iter(collector))
    assert batch["prev_action"].tolist() == [[0, 1, 0, 0, 1, 0, 0, 1]] * 2
    assert batch["action"].tolist() == [[1, 0, 1, 1, 0, 1, 1, 0]] * 2


def test_view_of_a_policy_output_needs_its_space() -> None:
    """A column the policy writes besides its action (here "logits") is viewed once its
    per-frame space is given; a space that does not fit what the policy writes is refused."""

    def act(observation: torch.Tensor, prev_logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
        logits = torch.cat([observation, prev_logits[..., :1] + 1], -1)
        return logits[..., 0].long() % 2, logits

    policy = TensorDictModule(
        act, in_keys=[keys.OBSERVATION, "prev_logits"], out_keys=["action", "logits"]
    )

    def views(size: int) -> dict[str, ViewRequirement]:
        return {"prev_logits": ViewRequirement("logits", shift=-1, space=Bounded(-99, 99, (size,)))}

    collector = Collector(
        counting_env(3), policy, frames_per_batch=4, total_frames=8, view_requirements=views(2)
    )
    data = collect_all(collector)
    assert data["logits"].tolist()[:4] == [[10, 1], [11, 11], [12, 12], [10, 1]]
    # zeros at episode starts (steps 0, 3, 6); the batch starting at step 4 sees step 3's
    expected = [[0, 0], [10, 1], [11, 11], [0, 0], [10, 1], [11, 11], [0, 0], [10, 1]]
    assert data["prev_logits"].tolist() == expected
    with pytest.raises(ValueError, match=r"'prev_logits'.*'logits' is torch.float32 of shape"):
        Collector(counting_env(3), policy, frames_per_batch=4, view_requirements=views(3))


# --- training-only and unstored columns -----------------------------------------------------------


def test_training_only_view_is_added_to_the_batch() -> None:
    views = {
        "next_actions": ViewRequirement("action", shift=1, used_for_compute_actions=False),
        "prev_actions": ViewRequirement("actions", shift=-1),  # RLlib's column name
    }
    recorder = Recorder(["prev_actions"])
    collector = Collector(
        counting_env(3), recorder.module(), frames_per_batch=5, total_frames=5,
        view_requirements=views,
    )  # fmt: skip
    batch = next(iter(collector))
    assert batch["action"].tolist() == [1, 0, 1, 1, 0]
    # within the episode; zero past its end (step 2) and past the batch's end (step 4)
    assert batch["next_actions"].tolist() == [0, 1, 0, 0, 0]
    assert "next_actions" not in collector.layout.carrier  # never shown to the policy


def test_unstored_view_reaches_the_policy_not_the_batch() -> None:
    views = {"prev_obs": ViewRequirement(keys.OBSERVATION, shift=-1, used_for_training=False)}
    recorder = Recorder(["prev_obs"])
    collector = Collector(
        counting_env(3), recorder.module(), frames_per_batch=4, total_frames=4,
        view_requirements=views,
    )  # fmt: skip
    batch = next(iter(collector))
    assert "prev_obs" not in batch
    received = recorder.received("prev_obs", 4, 0).squeeze(-1)
    assert received.tolist() == [10, 10, 11, 10]


# --- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("shift", [1, [-1, 1], "0:2"])
def test_positive_shift_at_inference_raises(shift: object) -> None:
    views = {"next_actions": ViewRequirement("action", shift=shift)}
    with pytest.raises(ValueError, match=r"next_actions.*positive shift at inference"):
        Collector(counting_env(), None, frames_per_batch=4, view_requirements=views)


def test_current_action_at_inference_raises() -> None:
    views = {"this_action": ViewRequirement("action", shift=0)}
    with pytest.raises(ValueError, match=r"'this_action'.*known up to shift -1"):
        Collector(counting_env(), None, frames_per_batch=4, view_requirements=views)


def test_unknown_data_col_raises() -> None:
    views = {"prev_logits": ViewRequirement("logits", shift=-1)}
    with pytest.raises(ValueError, match=r"'prev_logits'.*data_col='logits'.*space="):
        Collector(counting_env(), None, frames_per_batch=4, view_requirements=views)


@pytest.mark.parametrize(
    ("shift", "error", "message"),
    [
        ("-1:-3", ValueError, r"shift='-1:-3' is not a range.*\"-50:-1\""),
        ("-3", ValueError, r"is not a range"),
        (1.5, TypeError, r"shift must be an int \(-1\), a list of ints"),
        ([], TypeError, r"shift must be"),
    ],
)
def test_bad_shift_raises(shift: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        ViewRequirement(keys.OBSERVATION, shift=shift)  # type: ignore[arg-type]


def test_bad_view_declarations_raise() -> None:
    def build(views: object) -> Collector:
        return Collector(counting_env(), None, frames_per_batch=4, view_requirements=views)  # type: ignore[arg-type]

    with pytest.raises(TypeError, match=r"view_requirements\['prev'\] must be a ViewRequirement"):
        build({"prev": -1})
    with pytest.raises(ValueError, match=r"'action'.*already an entry"):
        build({"action": ViewRequirement(shift=-1)})
    with pytest.raises(ValueError, match=r"'_prev'.*may not start with '_'"):
        build({"_prev": ViewRequirement("action", shift=-1)})
    with pytest.raises(ValueError, match=r"'prev'.*neither to compute actions nor for training"):
        build(
            {
                "prev": ViewRequirement(
                    "action", shift=-1, used_for_training=False, used_for_compute_actions=False
                )
            }
        )
    with pytest.raises(ValueError, match=r"'prev'.*space's zero has shape \(3,\)"):
        build({"prev": ViewRequirement("reward", shift=-1, space=Bounded(0.0, 1.0, (3,)))})


def test_policy_and_collector_views_merge() -> None:
    policy = Recorder(["prev_obs"]).module()
    policy.view_requirements = {"prev_obs": ViewRequirement(keys.OBSERVATION, shift=-1)}
    extra = {"prev_reward": ViewRequirement("reward", shift=-1)}
    collector = Collector(
        counting_env(), policy, frames_per_batch=4, total_frames=4, view_requirements=extra
    )
    assert {"prev_obs", "prev_reward"} <= set(next(iter(collector)).keys())
    clash = {"prev_obs": ViewRequirement(keys.OBSERVATION, shift=-2)}
    with pytest.raises(ValueError, match=r"'prev_obs'.*on the policy and.*give it once"):
        Collector(counting_env(), policy, frames_per_batch=4, view_requirements=clash)


# --- worker processes -----------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children")
def test_multi_sync_workers_write_the_views() -> None:
    views = {name: VIEWS[name] for name in ("obs_range", "action_pair", "reward_minus_one")}
    policy = Recorder([]).module()
    with MultiSyncCollector(
        [functools.partial(counting_env, [3, 5], (2,))] * 2,
        policy,
        frames_per_batch=32,
        total_frames=96,
        view_requirements=views,
    ) as collector:
        data = collect_all(collector)
    assert data.batch_size == torch.Size([2, 2, 24])
    for name, requirement in views.items():
        assert torch.equal(data[name], expected_view(data, requirement.data_col, requirement.shift))


SOFT_HORIZON = {"max_frames_per_traj": 4, "soft_horizon": True}


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children")
@pytest.mark.parametrize("horizon", [{}, SOFT_HORIZON], ids=["episodes", "soft_horizon"])
def test_multi_async_workers_write_the_views(horizon: dict[str, object]) -> None:
    """Each worker's policy reads, and its batches hold, the views of its own run (episodes of
    3 and 5 steps; with a soft horizon of 4, the 5-step episodes are cut after step 4)."""
    names = ["obs_range", "action_pair", "reward_minus_one"]
    views = {name: VIEWS[name] for name in names}
    with MultiAsyncCollector(
        [functools.partial(counting_env, [3, 5], (2,))] * 2,
        echo_policy(names),
        frames_per_batch=8,
        total_frames=64,
        view_requirements=views,
        track_worker_id=True,
        **horizon,
    ) as collector:
        batches = list(collector)
    runs: dict[int, list[TensorDictBase]] = {}
    for batch in batches:
        runs.setdefault(int(batch[keys.WORKER_ID].flatten()[0]), []).append(batch)
    assert sorted(runs) == [0, 1]
    data = {worker: torch.cat(own, -1) for worker, own in runs.items()}  # each worker's run
    for run in data.values():
        for name, requirement in views.items():
            expected = expected_view(run, requirement.data_col, requirement.shift)
            assert torch.equal(run[name], expected), name
            assert torch.equal(run[f"seen_{name}"], expected), name
    longest = max(data.values(), key=lambda run: run.shape[-1])  # 4 batches of 4 steps or more
    # by hand, the 5-step sub-env: observations 10..14; a soft cut after 13 starts a trajectory
    # at 14 (no reset), whose views restart as after the reset that follows it (at 10)
    assert longest["observation"][1, :6].flatten().tolist() == [10.0, 11, 12, 13, 14, 10]
    windows = [[10, 10, 10], [10, 10, 10], [10, 10, 11], [10, 11, 12]]
    windows += [[14, 14, 14] if horizon else [11, 12, 13], [10, 10, 10]]
    assert longest["obs_range"][1, :6].squeeze(-1).tolist() == windows
    rewards = [0.0, 1, 1, 1, 0, 0] if horizon else [0.0, 1, 1, 1, 1, 0]
    assert longest["reward_minus_one"][1, :6].flatten().tolist() == rewards


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_views_on_cuda() -> None:
    collector = Collector(
        lambda: CountingEnv(episode_length=[3, 5], batch_size=(2,), device="cuda"),
        Recorder(list(VIEWS)).module(),
        frames_per_batch=8,
        total_frames=32,
        device="cuda",
        view_requirements=VIEWS,
    )
    data = collect_all(collector).cpu()
    for name, requirement in VIEWS.items():
        assert torch.equal(data[name], expected_view(data, requirement.data_col, requirement.shift))

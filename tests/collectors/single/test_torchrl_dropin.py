"""TorchRL drop-in gaps, each driven side by side with TorchRL's Collector."""

from __future__ import annotations

import functools

import pytest
import torch
from tensordict import NonTensorData, TensorDictBase
from tensordict.nn import TensorDictModule

from rlcollect import Collector
from rlcollect.envs import GymEnv
from tests.collectors.single.torchrl_parity import assert_same_batches, collect_both

torchrl_collectors = pytest.importorskip("torchrl.collectors")
torchrl_envs = pytest.importorskip("torchrl.envs")
torchrl_modules = pytest.importorskip("torchrl.modules")


def add_private_entries(batch: TensorDictBase) -> TensorDictBase:
    batch.set("_scratch", torch.zeros(batch.batch_size))
    batch.set(("next", "_seen"), torch.ones(batch.batch_size))
    batch.set(("_bookkeeping", "count"), torch.ones(batch.batch_size))
    return batch


def test_private_keys_are_left_out_of_batches_as_in_torchrl() -> None:
    ours, theirs = collect_both(postproc=add_private_entries)
    for batch in ours:
        assert "_scratch" not in batch
        assert ("next", "_seen") not in batch.keys(include_nested=True)
        assert "_bookkeeping" not in batch
    assert_same_batches(ours, theirs)


def run_both(
    ours_env: object, theirs_env: object, policy: object, **options: object
) -> tuple[list, list]:
    """Batches of our Collector on `ours_env` and of TorchRL's on `theirs_env`."""
    batches = []
    for collector_class, env in ((Collector, ours_env), (torchrl_collectors.Collector, theirs_env)):
        collector = collector_class(env, policy, frames_per_batch=20, total_frames=40, **options)
        batches.append(list(collector))
        collector.shutdown()
    return batches[0], batches[1]


def test_a_torchrl_env_class_is_called_to_make_the_env() -> None:
    pendulum = torchrl_envs.PendulumEnv
    ours, theirs = run_both(pendulum, pendulum, None)
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine.batch_size == reference.batch_size == torch.Size([20])
        assert mine["action"].shape == reference["action"].shape


def test_random_policy_without_a_spec_takes_the_envs() -> None:
    ours, theirs = run_both(
        lambda: GymEnv("Pendulum-v1"),
        lambda: torchrl_envs.GymEnv("Pendulum-v1"),
        torchrl_modules.RandomPolicy(),
    )
    for batch in (*ours, *theirs):
        assert batch["action"].shape == (20, 1)
        assert batch["action"].abs().max() <= 2.0
        assert batch["action"].std() > 0
    # Our collector over a TorchRL env, too.
    torchrl_env = torchrl_envs.GymEnv("Pendulum-v1")
    collector = Collector(torchrl_env, torchrl_modules.RandomPolicy(), frames_per_batch=20)
    assert collector.next()["action"].shape == (20, 1)
    collector.shutdown()


def test_stats_carry_torchrl_entries() -> None:
    entries = ("frames", "batches", "total_frames", "completed", "requested_frames_per_batch")
    stats = []
    for collector_class in (Collector, torchrl_collectors.Collector):
        collector = collector_class(
            torchrl_envs.GymEnv("CartPole-v1"), None, frames_per_batch=20, total_frames=40
        )
        list(collector)
        stats.append(collector.stats())
        collector.shutdown()
    ours, theirs = stats
    assert {key: ours[key] for key in entries} == {key: theirs[key] for key in entries}
    assert ours["completed"] is True
    assert ours["policy_version"] == 0


class ConstantTorque(torch.nn.Module):
    def forward(self, th: torch.Tensor) -> torch.Tensor:
        return (
            torch.full_like(th, 0.5).reshape(*th.shape[:-1], 1)
            if th.ndim
            else th.new_full((1,), 0.5)
        )


def test_max_frames_per_traj_adds_a_truncated_flag_as_torchrl_does() -> None:
    batches = []
    for collector_class in (Collector, torchrl_collectors.Collector):
        env = torchrl_envs.PendulumEnv()
        assert "truncated" not in env.done_keys
        env.set_seed(3)
        policy = TensorDictModule(ConstantTorque(), in_keys=["th"], out_keys=["action"])
        collector = collector_class(
            env, policy, frames_per_batch=12, total_frames=36, max_frames_per_traj=5
        )
        batches.append(list(collector))
        collector.shutdown()
    ours, theirs = batches
    assert ours[0]["next", "truncated"].flatten().tolist()[:6] == [False] * 4 + [True, False]
    # Resets hand TorchRL only the reset flags: the env's own params, not the buffer's zeros.
    assert torch.all(ours[0]["params", "m"] == 1.0)
    assert_same_batches(ours, theirs)


def test_collect_hooks_run_around_every_batch_as_in_torchrl() -> None:
    calls: dict[str, list] = {"ours": [], "theirs": []}

    def hooks(name: str) -> dict[str, object]:
        return {
            "pre_collect_hook": lambda: calls[name].append("pre"),
            "post_collect_hook": lambda batch: calls[name].append(
                ("post", tuple(batch.batch_size), "_scratch" in batch)
            ),
            "postproc": add_private_entries,
        }

    for name, collector_class, env in (
        ("ours", Collector, GymEnv("CartPole-v1")),
        ("theirs", torchrl_collectors.Collector, torchrl_envs.GymEnv("CartPole-v1")),
    ):
        collector = collector_class(env, None, frames_per_batch=10, total_frames=30, **hooks(name))
        list(collector)
        collector.shutdown()
    assert calls["ours"] == calls["theirs"]
    assert calls["ours"][:2] == ["pre", ("post", (10,), False)]


def test_track_traj_ids_false_leaves_the_ids_out_as_in_torchrl() -> None:
    ours, theirs = collect_both(track_traj_ids=False)
    assert ("collector", "traj_ids") not in ours[0].keys(include_nested=True)
    assert_same_batches(ours, theirs)
    with pytest.raises(ValueError, match=r"split_trajs=True .* needs track_traj_ids=True"):
        Collector("CartPole-v1", frames_per_batch=10, split_trajs=True, track_traj_ids=False)


def test_policy_factory_and_no_op_options_are_accepted() -> None:
    from tests.collectors.policies import greedy_module

    ours, theirs = collect_both(use_buffers=True, trust_policy=True)
    assert_same_batches(ours, theirs)
    collector = Collector("CartPole-v1", policy_factory=greedy_module, frames_per_batch=10)
    assert collector.next()["action"].shape == (10, 2)
    collector.shutdown()
    with pytest.raises(TypeError, match=r"use_buffers must be True, False or None; got 'yes'"):
        Collector("CartPole-v1", frames_per_batch=10, use_buffers="yes")
    with pytest.raises(TypeError, match=r"policy_factory cannot be used with policy"):
        Collector("CartPole-v1", greedy_module(), policy_factory=greedy_module, frames_per_batch=4)


@pytest.mark.slow
def test_auto_register_policy_transforms_adds_the_init_flag_a_recurrent_policy_reads() -> None:
    from tests.collectors.policy.recurrent_policies import lstm_policy

    batches = []
    for collector_class in (Collector, torchrl_collectors.Collector):
        env = torchrl_envs.GymEnv("CartPole-v1")
        env.set_seed(0)
        policy, _ = lstm_policy()
        collector = collector_class(
            env,
            policy,
            frames_per_batch=40,
            total_frames=80,
            auto_register_policy_transforms=True,
        )
        batches.append(list(collector))
        collector.shutdown()
    ours, theirs = batches
    assert any(bool(batch["next", "done"].any()) for batch in ours)
    assert bool(ours[0]["is_init"][0].all())
    assert_same_batches(ours, theirs)


def test_a_policy_reading_a_missing_init_flag_names_auto_register_policy_transforms() -> None:
    from tests.collectors.policy.recurrent_policies import lstm_policy

    policy, _ = lstm_policy()
    for value in (None, False):
        with pytest.raises(KeyError, match=r"\['is_init'\].*auto_register_policy_transforms"):
            Collector(
                GymEnv("CartPole-v1"),
                policy,
                frames_per_batch=8,
                auto_register_policy_transforms=value,
            )
    with pytest.raises(TypeError, match=r"auto_register_policy_transforms must be"):
        Collector(
            GymEnv("CartPole-v1"), policy, frames_per_batch=8, auto_register_policy_transforms="yes"
        )


def test_enable_profile_writes_a_trace_of_the_profiled_batches(tmp_path) -> None:
    collector = Collector("CartPole-v1", None, frames_per_batch=16, total_frames=96)
    path = tmp_path / "trace_{worker_idx}.json"
    collector.enable_profile(num_rollouts=2, warmup_rollouts=1, save_path=path)
    assert collector.profile_config is not None
    iterator = iter(collector)
    next(iterator)
    assert not (tmp_path / "trace_0.json").exists()
    next(iterator)
    assert (tmp_path / "trace_0.json").stat().st_size > 0
    assert collector.profile_config is None  # the session ended by itself
    collector.disable_profile()  # a no-op now
    with pytest.raises(ValueError, match=r"warmup_rollouts < num_rollouts"):
        collector.enable_profile(num_rollouts=1, warmup_rollouts=1)
    with pytest.raises(RuntimeError, match=r"Cannot enable profiling after iteration"):
        collector.enable_profile(num_rollouts=2, warmup_rollouts=1)
    collector.shutdown()


def test_hooks_are_settable_attributes_and_profiling_wraps_the_post_hook(tmp_path) -> None:
    """TorchRL's `pre_collect_hook` / `post_collect_hook` attributes: None by default,
    settable between batches; `enable_profile` installs the profiler as the post hook (the
    user's still runs), `disable_profile` puts the user's back. Side by side with TorchRL."""
    from torchrl.collectors import Collector as TorchRLCollector

    def counts(collector_class: type) -> tuple[int, int, int]:
        calls = {"pre": 0, "post": 0, "seen": 0}
        collector = collector_class(
            GymEnv("CartPole-v1"), None, frames_per_batch=8, total_frames=32
        )
        assert collector.pre_collect_hook is None
        assert collector.post_collect_hook is None

        def pre() -> None:
            calls["pre"] += 1

        def post(batch: TensorDictBase) -> None:
            calls["post"] += 1

        collector.pre_collect_hook, collector.post_collect_hook = pre, post
        assert collector.pre_collect_hook is pre
        assert collector.post_collect_hook is post
        collector.enable_profile(
            num_rollouts=2, warmup_rollouts=1, save_path=tmp_path / "t{worker_idx}.json"
        )
        assert collector.post_collect_hook is not post
        calls["seen"] = sum(1 for _ in collector)
        collector.disable_profile()
        assert collector.post_collect_hook is post
        collector.post_collect_hook = None
        assert collector.post_collect_hook is None
        collector.shutdown()
        return calls["pre"], calls["post"], calls["seen"]

    ours = counts(Collector)
    assert ours == (4, 4, 4)
    assert (tmp_path / "t0.json").stat().st_size > 0
    (tmp_path / "t0.json").unlink()
    from torchrl.envs import GymEnv as TorchRLGymEnv

    theirs: list[int] = []
    collector = TorchRLCollector(
        TorchRLGymEnv("CartPole-v1"), None, frames_per_batch=8, total_frames=32
    )
    assert collector.pre_collect_hook is None
    assert collector.post_collect_hook is None
    collector.post_collect_hook = lambda batch: theirs.append(batch.numel())
    list(collector)
    collector.shutdown()
    assert len(theirs) == ours[1]
    with pytest.raises(TypeError, match=r"post_collect_hook must be a callable"):
        Collector("CartPole-v1", None, frames_per_batch=8).post_collect_hook = 3


@pytest.mark.timeout(120)
def test_enable_profile_profiles_the_chosen_workers_in_their_processes(
    tmp_path, no_leftover_children: None
) -> None:
    from rlcollect import MultiSyncCollector

    collector = MultiSyncCollector(
        ["CartPole-v1", "CartPole-v1"], None, frames_per_batch=32, total_frames=128
    )
    with pytest.raises(ValueError, match=r"workers \[2\] that do not exist"):
        collector.enable_profile(workers=[2])
    collector.enable_profile(
        workers=[1], num_rollouts=2, warmup_rollouts=0, save_path=tmp_path / "w{worker_idx}.json"
    )
    list(collector)
    collector.shutdown()
    assert [path.name for path in tmp_path.iterdir()] == ["w1.json"]


class RejectsImpossibleObservations(torch.nn.Module):
    """A greedy CartPole policy that refuses an all-zero observation, as a policy with an
    action mask refuses a mask of all zeros."""

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        if bool((observation == 0).all(-1).any()):
            raise ValueError("an all-zero observation cannot come from this env")
        return torch.nn.functional.one_hot((observation[..., 2] > 0).long(), 2)


def test_the_policy_is_probed_on_the_envs_real_first_observation() -> None:
    batches = []
    for collector_class, env in (
        (Collector, GymEnv("CartPole-v1")),
        (torchrl_collectors.Collector, torchrl_envs.GymEnv("CartPole-v1")),
    ):
        env.set_seed(5)
        policy = TensorDictModule(
            RejectsImpossibleObservations(), in_keys=["observation"], out_keys=["action"]
        )
        collector = collector_class(env, policy, frames_per_batch=20, total_frames=40)
        batches.append(list(collector))
        collector.shutdown()
    ours, theirs = batches
    assert_same_batches(ours, theirs)
    # The first batch starts from the observation the probe saw: one reset, not two.
    env = GymEnv("CartPole-v1")
    env.set_seed(5)
    assert torch.equal(ours[0]["observation"][0], env.reset()["observation"])


def test_an_env_without_a_device_gets_tensordicts_without_one() -> None:
    mocks = pytest.importorskip("torchrl.testing.mocking_classes")
    seen: list[tuple[str, object]] = []

    class DevicelessCountingEnv(mocks.CountingEnv):
        def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
            seen.append(("step", tensordict.device))
            return super()._step(tensordict)

        def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
            seen.append(("reset", None if tensordict is None else tensordict.device))
            return super()._reset(tensordict, **kwargs)

    def make_env() -> object:
        return DevicelessCountingEnv(max_steps=3, batch_size=(2,), device=None)

    policy = mocks.CountingEnvCountPolicy(make_env().full_action_spec["action"])
    batches, devices = [], []
    for collector_class in (Collector, torchrl_collectors.Collector):
        seen.clear()
        collector = collector_class(make_env(), policy, frames_per_batch=8, total_frames=16)
        batches.append(list(collector))
        collector.shutdown()
        devices.append(set(seen))
    assert devices[0] == devices[1] == {("step", None), ("reset", None)}
    assert batches[0][0].device is None
    assert_same_batches(*batches)


def tagging_env(batched: bool) -> object:
    """A TorchRL CartPole (two of them in a TorchRL SerialEnv when `batched`) whose transform
    writes a string: "reset" at resets, "step <n>" at steps."""
    from torchrl.data import NonTensor

    class Tag(torchrl_envs.Transform):
        def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
            steps = int(next_tensordict["observation"].abs().sum() * 1000)
            next_tensordict.set("tag", NonTensorData(f"step {steps}"))
            return next_tensordict

        def _reset(self, tensordict: TensorDictBase, reset: TensorDictBase) -> TensorDictBase:
            reset.set("tag", NonTensorData("reset"))
            return reset

        def transform_observation_spec(self, spec: object) -> object:
            spec["tag"] = NonTensor(shape=spec.shape, example_data="x")  # type: ignore[index]
            return spec

    def cartpole() -> object:
        return torchrl_envs.GymEnv("CartPole-v1")

    base = torchrl_envs.SerialEnv(2, cartpole) if batched else cartpole()
    env = torchrl_envs.TransformedEnv(base, Tag())
    env.set_seed(1)
    return env


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
def test_non_tensor_entries_are_carried_as_in_torchrl(batched: bool) -> None:
    from tests.collectors.policies import greedy_module

    batches = []
    for collector_class in (Collector, torchrl_collectors.Collector):
        collector = collector_class(
            tagging_env(batched), greedy_module(), frames_per_batch=40, total_frames=160
        )
        batches.append(list(collector))
        collector.shutdown()
    ours, theirs = batches
    assert_same_batches(ours, theirs)
    differences = 0
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine["next", "tag"] == reference["next", "tag"]
        started = _started(mine)
        for position, (tag, their_tag) in enumerate(
            zip(_flat(mine["tag"]), _flat(reference["tag"]), strict=True)
        ):
            if tag != their_tag:
                # A documented difference: after a partial reset of a batched env, TorchRL keeps
                # the pre-reset value when the entry was one value for every sub-env; we keep
                # what the reset wrote for the sub-env that reset.
                assert batched
                assert tag == "reset"
                assert started[position]
                differences += 1
    tags = [tag for batch in ours for tag in _flat(batch["tag"])]
    assert tags.count("reset") >= 2  # a reset inside a batch, not only the first one
    assert differences <= tags.count("reset")


def _started(batch: TensorDictBase) -> list[bool]:
    """Per frame (flattened like the tags), whether an episode started there."""
    done = batch["next", "done"].squeeze(-1)
    started = torch.zeros_like(done)
    started[..., 1:] = done[..., :-1]
    return started.flatten().tolist()


def _flat(values: object) -> list:
    return (
        [item for value in values for item in _flat(value)]
        if isinstance(values, list)
        else [values]
    )


@pytest.mark.timeout(120)
def test_non_tensor_entries_come_back_from_worker_processes(no_leftover_children: None) -> None:
    from rlcollect import MultiAsyncCollector, MultiSyncCollector
    from tests.collectors.policies import greedy_module

    make_env = functools.partial(tagging_env, False)
    single = Collector(make_env(), greedy_module(), frames_per_batch=20, total_frames=40)
    expected = [batch["tag"] for batch in single]
    single.shutdown()
    sync = MultiSyncCollector(
        [make_env, make_env], greedy_module(), frames_per_batch=40, total_frames=80
    )
    for batch, tags in zip(sync, expected, strict=True):
        assert batch["tag"] == [tags, tags]  # both workers: the same seeded env and policy
    sync.shutdown()
    asynchronous = MultiAsyncCollector(
        [make_env], greedy_module(), frames_per_batch=20, total_frames=40
    )
    assert [batch["tag"] for batch in asynchronous] == expected
    asynchronous.shutdown()

"""What TorchRL's own collector test-file checks of a single-process `Collector`, guarded here
(CI cannot reach that file): each behaviour side by side with TorchRL's `Collector`."""

from __future__ import annotations

import warnings

import pytest
import torch
from tensordict.nn import TensorDictModuleBase
from torchrl.collectors import Collector as TorchRLCollector
from torchrl.envs import EnvCreator, InitTracker, TransformedEnv
from torchrl.envs import GymEnv as TorchRLGymEnv
from torchrl.modules import RandomPolicy

from rlcollect import Collector


def cartpole_with_init_tracker() -> TransformedEnv:
    return TransformedEnv(TorchRLGymEnv("CartPole-v1"), InitTracker())


def test_an_env_creator_is_an_env_maker() -> None:
    """TorchRL's `EnvCreator` is called like any env maker (it used to be taken for an env
    instance because its class lives in `torchrl.*`)."""
    maker = EnvCreator(lambda: TorchRLGymEnv("CartPole-v1"))
    ours = Collector(maker, None, frames_per_batch=10, total_frames=10)
    theirs = TorchRLCollector(maker, None, frames_per_batch=10, total_frames=10)
    (batch,), (reference,) = list(ours), list(theirs)
    ours.shutdown()
    theirs.shutdown()
    assert batch.batch_size == reference.batch_size == torch.Size([10])
    assert set(batch.keys(True, True)) == set(reference.keys(True, True))


@pytest.mark.parametrize("split_trajs", [False, True])
def test_fake_tensordict_is_keyed_and_shaped_as_a_real_batch(split_trajs: bool) -> None:
    """`fake_tensordict()`: zeros with a real batch's keys, shape, names and dtypes, without
    stepping the env or calling the post-collect hook; TorchRL's has the same keys."""
    hooked: list[int] = []
    options = {"frames_per_batch": 20, "total_frames": 20, "split_trajs": split_trajs}
    env = cartpole_with_init_tracker()
    collector = Collector(
        cartpole_with_init_tracker,
        RandomPolicy(env.action_spec),
        post_collect_hook=lambda batch: hooked.append(batch.numel()),
        **options,
    )
    fake = collector.fake_tensordict()
    assert hooked == []
    assert collector.frames == 0
    real = next(iter(collector))
    collector.shutdown()
    if not split_trajs:  # a split batch's shape depends on where episodes end
        assert fake.batch_size == real.batch_size
        assert fake.names == real.names
    assert set(fake.keys(True, True)) == set(real.keys(True, True))
    for key, value in fake.items(True, True):
        assert value.dtype == real.get(key).dtype, key
        if key != ("collector", "mask"):  # split_trajs marks the (zero) steps it kept
            assert not value.any(), key
    theirs = TorchRLCollector(cartpole_with_init_tracker, RandomPolicy(env.action_spec), **options)
    reference = theirs.fake_tensordict()
    theirs.shutdown()
    assert set(fake.keys(True, True)) == set(reference.keys(True, True))


def test_get_distant_attr_and_map_fn_as_torchrl() -> None:
    results = []
    for collector_class in (Collector, TorchRLCollector):
        collector = collector_class(
            lambda: TorchRLGymEnv("CartPole-v1"),
            None,
            frames_per_batch=16,
            total_frames=16,
            worker_idx=5,
        )
        results.append(
            (
                collector.get_distant_attr("worker_idx"),
                collector.map_fn(
                    "get_distant_attr", list_of_args=[("worker_idx",), ("frames_per_batch",)]
                ),
            )
        )
        with pytest.raises(ValueError, match="same length"):
            collector.map_fn(
                "get_distant_attr", list_of_args=[("worker_idx",)], list_of_kwargs=[{}, {}]
            )
        collector.shutdown()
    assert results[0] == results[1] == (5, [5, 16])


@pytest.mark.parametrize(("num_envs", "ndim"), [(1, 1), (2, 1), (2, 2)])
def test_extend_buffer_false_writes_every_step_as_an_item(num_envs: int, ndim: int) -> None:
    """TorchRL's `extend_buffer=False`: each step is one item of the buffer (its env batch),
    in time order; as many items, of the same shape, as TorchRL's collector writes (a 2-dim
    storage too, which lays each step out along its second dim)."""
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from torchrl.envs import SerialEnv, StepCounter

    def make_one() -> TransformedEnv:
        return TransformedEnv(TorchRLGymEnv("CartPole-v1"), StepCounter())

    def make_env() -> TransformedEnv | SerialEnv:
        return make_one() if num_envs == 1 else SerialEnv(num_envs, make_one)

    buffers = []
    for collector_class in (Collector, TorchRLCollector):
        buffer = ReplayBuffer(storage=LazyTensorStorage(64, ndim=ndim))
        collector = collector_class(
            make_env,
            None,
            frames_per_batch=16,
            total_frames=32,
            replay_buffer=buffer,
            extend_buffer=False,
        )
        assert list(collector) == [None, None]
        collector.shutdown()
        buffers.append(buffer)
    ours, theirs = (buffer[:] for buffer in buffers)
    assert ours.batch_size == theirs.batch_size
    assert len(buffers[0]) == len(buffers[1])
    if ndim == 2:  # TorchRL's 2-dim storage reads back env-major: [envs, steps]
        assert ours.batch_size == torch.Size([num_envs, 16])
        ours = ours.transpose(0, 1)
    expected = torch.Size([32]) if num_envs == 1 else torch.Size([16, num_envs])
    assert ours.batch_size == expected
    steps = ours["step_count"].reshape(32 // num_envs, num_envs)
    # item i + 1 is the step after item i in each env, unless that env was reset in between
    following = (steps[1:] == steps[:-1] + 1) | (steps[1:] == 0)
    assert following.all()
    with pytest.raises(TypeError, match=r"postproc must be None/False .* \(extend_buffer=False\)"):
        Collector(
            make_env,
            None,
            frames_per_batch=16,
            replay_buffer=buffers[0],
            extend_buffer=False,
            postproc=lambda batch: batch,
        )


def test_trajs_per_batch_default_layout_warns_as_torchrl() -> None:
    """`trajs_per_batch` without `traj_format`: "padded", with TorchRL's FutureWarning about
    its coming default; silent with an explicit format or a replay buffer; a bad format is
    refused naming both choices."""
    from torchrl.data import ReplayBuffer

    for collector_class in (Collector, TorchRLCollector):
        options = {"frames_per_batch": 8, "total_frames": 16}
        with pytest.warns(FutureWarning, match="will change to 'cat' in torchrl v0.16"):
            collector = collector_class(TorchRLGymEnv("CartPole-v1"), trajs_per_batch=2, **options)
        assert collector.traj_format == "padded"
        collector.shutdown()
        for quiet in ({"traj_format": "cat"}, {"replay_buffer": ReplayBuffer()}):
            with warnings.catch_warnings():
                warnings.simplefilter("error", FutureWarning)
                collector_class(
                    TorchRLGymEnv("CartPole-v1"), trajs_per_batch=2, **quiet, **options
                ).shutdown()
        with pytest.raises(ValueError, match="must be 'padded' or 'cat'"):
            collector_class(
                TorchRLGymEnv("CartPole-v1"), trajs_per_batch=2, traj_format="flat", **options
            )


def test_a_batch_without_device_reaches_the_buffer_on_its_storage_device() -> None:
    """A `postproc` that clears the batch's device: the buffer still receives it on its
    storage's device (TorchRL's collector does the same)."""
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    buffer = ReplayBuffer(storage=LazyTensorStorage(64, device="cpu"))
    devices = []
    extend = buffer.extend

    def recording_extend(data):
        devices.append(data.device)
        return extend(data)

    buffer.extend = recording_extend
    collector = Collector(
        "CartPole-v1",
        None,
        frames_per_batch=8,
        total_frames=16,
        replay_buffer=buffer,
        postproc=lambda batch: batch.clear_device_(),
    )
    list(collector)
    collector.shutdown()
    assert devices == [torch.device("cpu")] * 2
    assert len(buffer) == 16


class DeviceRecorder(TensorDictModuleBase):
    """A parameterless TensorDict policy that records the device of what it reads."""

    in_keys = ["observation"]
    out_keys = ["action"]

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.device | None] = []

    def forward(self, tensordict):
        self.seen.append(tensordict.device)
        return tensordict.set("action", torch.ones(*tensordict.batch_size, 1))


@pytest.mark.parametrize(
    ("options", "policy_reads", "batch_device"),
    [
        ({}, None, None),
        ({"policy_device": "cpu"}, torch.device("cpu"), None),
        ({"storing_device": "cpu"}, None, torch.device("cpu")),
        ({"device": "cpu"}, torch.device("cpu"), torch.device("cpu")),
    ],
)
def test_a_device_less_env_moves_to_the_devices_asked_for(
    options: dict, policy_reads: torch.device | None, batch_device: torch.device | None
) -> None:
    """A TorchRL env without a device: the policy reads TensorDicts on `policy_device` (or
    `device`) when one is given, else without a device; batches carry `storing_device` (or
    `device`) when given. As TorchRL's collector does."""
    from torchrl.testing.mocking_classes import CountingEnv

    for collector_class in (Collector, TorchRLCollector):
        policy = DeviceRecorder()
        collector = collector_class(
            CountingEnv(device=None), policy, frames_per_batch=4, total_frames=4, **options
        )
        (batch,) = list(collector)
        collector.shutdown()
        assert set(policy.seen) == {policy_reads}, collector_class
        assert batch.device == batch_device, collector_class


@pytest.mark.parametrize(
    ("options", "batch_device"),
    [
        ({}, None),
        ({"env_device": "cpu"}, None),
        ({"policy_device": "cpu"}, None),
        ({"env_device": "cpu", "policy_device": "cpu"}, torch.device("cpu")),
        ({"device": "cpu"}, torch.device("cpu")),
        ({"storing_device": "cpu"}, torch.device("cpu")),
    ],
)
def test_batches_carry_a_device_only_when_one_is_given(
    options: dict, batch_device: torch.device | None
) -> None:
    """An env with a device (TorchRL's CountingEnv on CPU): batches carry `storing_device`
    (or `device`, or the device `env_device` and `policy_device` share) when one is given and
    no device otherwise, as TorchRL's collector."""
    from torchrl.testing.mocking_classes import CountingEnv

    for collector_class in (Collector, TorchRLCollector):
        collector = collector_class(
            CountingEnv(device="cpu"), None, frames_per_batch=4, total_frames=4, **options
        )
        (batch,) = list(collector)
        collector.shutdown()
        assert batch.device == batch_device, collector_class


class ActsAndWritesTheReward(torch.nn.Module):
    """Pushes left and writes `("next", "reward")` itself, as TorchRL's `env.rand_step` used
    as a policy does (the env's step then writes the reward it computes)."""

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch = observation.shape[:-1]
        return torch.zeros(batch, dtype=torch.long), torch.zeros(*batch, 1)


def test_a_policy_writing_the_next_reward_adds_no_root_key_as_torchrl() -> None:
    """A policy output under `"next"` that is one of the env's rewards or done flags is not
    recurrent state: the batch's keys are TorchRL's (no root `"reward"`)."""
    from tensordict.nn import TensorDictModule

    policy = TensorDictModule(
        ActsAndWritesTheReward(), in_keys=["observation"], out_keys=["action", ("next", "reward")]
    )
    layouts = []
    for collector_class in (Collector, TorchRLCollector):
        env = TorchRLGymEnv("CartPole-v1", categorical_action_encoding=True)
        collector = collector_class(env, policy, frames_per_batch=8, total_frames=8)
        batch = next(iter(collector))
        collector.shutdown()
        layouts.append(sorted(map(str, batch.keys(True, True))))
    assert layouts[0] == layouts[1]
    assert "reward" not in layouts[0]


REGISTER_SCRIPT = """
from torchrl.collectors import BaseCollector
from rlcollect.collectors import Collector, MultiAsyncCollector, MultiSyncCollector

collector = Collector("CartPole-v1", None, frames_per_batch=10, total_frames=10)
before = isinstance(collector, BaseCollector)
for collector_class in (Collector, MultiSyncCollector, MultiAsyncCollector):
    BaseCollector.register(collector_class)
print(before, isinstance(collector, BaseCollector), issubclass(MultiSyncCollector, BaseCollector))
collector.shutdown()
"""


def test_our_collectors_pass_torchrls_base_collector_check_and_registering_again_is_harmless() -> (
    None
):
    """TorchRL's trainers check `isinstance(collector, BaseCollector)`: ours pass it as soon as
    TorchRL is imported (tests/torchrl_frontends/test_base_collector.py); the manual
    `BaseCollector.register` that earlier docs told users to call changes nothing. In a
    process of its own: a registration lasts for the life of the process."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", REGISTER_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "True", "True"]

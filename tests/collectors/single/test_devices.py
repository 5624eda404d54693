"""The device split: resolution rules on any machine, real CUDA runs where there is a GPU."""

from __future__ import annotations

import pytest
import torch

from rlcollect import Collector
from rlcollect.collectors.devices import DeviceSplit
from rlcollect.collectors.policy.holder import PolicyHolder
from rlcollect.envs import GymEnv
from tests.collectors.policies import greedy_module

CPU = torch.device("cpu")
META = torch.device("meta")


def test_device_fills_unset_devices() -> None:
    split = DeviceSplit.resolve(env_own_device=CPU, device="meta")
    assert split == DeviceSplit(env=META, policy=META, storing=META)


def test_env_device_defaults_to_env_then_others_follow() -> None:
    split = DeviceSplit.resolve(env_own_device=CPU)
    assert split == DeviceSplit(env=CPU, policy=CPU, storing=CPU)
    assert not split.policy_crosses
    assert not split.storing_crosses


def test_explicit_devices_win_over_device() -> None:
    split = DeviceSplit.resolve(
        env_own_device=CPU, device="meta", env_device="cpu", storing_device="cpu"
    )
    assert split == DeviceSplit(env=CPU, policy=META, storing=CPU)
    assert split.policy_crosses
    assert not split.storing_crosses


def test_policy_on_its_device_is_not_copied() -> None:
    policy = greedy_module()
    collector = Collector(
        GymEnv("CartPole-v1"), policy, frames_per_batch=10, total_frames=10, device="cpu"
    )
    assert collector.policy is policy


def test_policy_on_another_device_is_copied_there() -> None:
    policy = greedy_module()
    holder = PolicyHolder(policy, [("observation",)], META)
    assert holder.module is not policy
    assert {p.device for p in holder.module.parameters()} == {META}
    assert {p.device for p in policy.parameters()} == {CPU}, "the user's policy was moved"


def test_same_devices_move_no_data() -> None:
    collector = Collector(
        GymEnv("CartPole-v1"), greedy_module(), frames_per_batch=10, total_frames=10
    )
    assert collector.devices == DeviceSplit(env=CPU, policy=CPU, storing=CPU)
    assert collector.layout.carrier.device == CPU
    batch = collector.next()
    assert batch.device is None  # no device or storing_device given: none, as TorchRL


def test_cuda_without_index_means_the_current_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    cuda1 = torch.device("cuda", 1)
    split = DeviceSplit.resolve(env_own_device=cuda1, device="cuda")
    assert split == DeviceSplit(env=cuda1, policy=cuda1, storing=cuda1)
    assert not split.policy_crosses, "'cuda' and 'cuda:1' would move data for nothing"
    assert not split.storing_crosses


@pytest.mark.parametrize("argument", ["device", "storing_device", "policy_device", "env_device"])
def test_unknown_device_string_is_refused(argument: str) -> None:
    with pytest.raises(ValueError, match=f"{argument}='gpu0' is not a device"):
        Collector("CartPole-v1", None, frames_per_batch=10, **{argument: "gpu0"})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
@pytest.mark.parametrize("argument", ["device", "storing_device", "policy_device", "env_device"])
def test_cuda_device_without_cuda_is_refused_at_construction(argument: str) -> None:
    with pytest.raises(ValueError, match=f"{argument}='cuda' is a CUDA device, but CUDA is not"):
        Collector("CartPole-v1", None, frames_per_batch=10, **{argument: "cuda"})


def test_cuda_index_beyond_the_machine_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"storing_device='cuda:3' names CUDA device 3, .* has 1"):
        DeviceSplit.resolve(env_own_device=CPU, storing_device="cuda:3")


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@needs_cuda
def test_policy_on_cuda_env_on_cpu_storing_on_cuda() -> None:
    policy = greedy_module()
    collector = Collector(
        GymEnv("CartPole-v1"),
        policy,
        frames_per_batch=20,
        total_frames=40,
        policy_device="cuda",
        storing_device="cuda",
    )
    assert collector.policy is not policy  # a copy moved to CUDA
    assert next(collector.policy.parameters()).device.type == "cuda"
    batches = list(collector)
    assert all(batch["observation"].device.type == "cuda" for batch in batches)
    reference = Collector(
        GymEnv("CartPole-v1"), greedy_module(), frames_per_batch=20, total_frames=40
    )
    collector_env_seeded = Collector(
        GymEnv("CartPole-v1"),
        greedy_module(),
        frames_per_batch=20,
        total_frames=40,
        policy_device="cuda",
    )
    reference.set_seed(1)
    collector_env_seeded.set_seed(1)
    for mine, theirs in zip(collector_env_seeded, reference, strict=True):
        assert torch.equal(mine["action"], theirs["action"])


@pytest.mark.gpu
@needs_cuda
def test_update_weights_copies_into_cuda_policy() -> None:
    policy = greedy_module()
    collector = Collector(
        GymEnv("CartPole-v1"),
        policy,
        frames_per_batch=10,
        total_frames=20,
        device="cuda",
        env_device="cpu",
    )
    with torch.no_grad():
        policy.module.linear.bias.fill_(3.0)
    collector.update_policy_weights_()
    assert torch.equal(collector.policy.module.linear.bias.cpu(), torch.full((2,), 3.0))


@pytest.mark.gpu
@needs_cuda
def test_policy_already_on_cuda_is_not_copied() -> None:
    policy = greedy_module().to("cuda")
    collector = Collector(
        GymEnv("CartPole-v1"), policy, frames_per_batch=10, total_frames=10, policy_device="cuda"
    )
    assert collector.policy is policy
    assert collector.next()["action"].device.type == "cpu"


def test_the_split_remembers_which_devices_were_asked_for() -> None:
    """Asked-for devices matter for envs and policies without a device of their own (TorchRL
    moves their TensorDicts only to a device it was given)."""
    assert not DeviceSplit.resolve(env_own_device=CPU).storing_is_explicit
    assert not DeviceSplit.resolve(env_own_device=CPU).policy_is_explicit
    split = DeviceSplit.resolve(env_own_device=CPU, device="cpu")
    assert split.storing_is_explicit
    assert split.policy_is_explicit
    split = DeviceSplit.resolve(env_own_device=CPU, policy_device="cpu")
    assert split.policy_is_explicit
    assert not split.storing_is_explicit

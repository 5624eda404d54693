"""Policies holding meta or lazy tensors (BenchMARL's GRU and LSTM models, TorchRL's recurrent
modules under a `LazyLinear` head) collect as on TorchRL's `Collector`, take weight updates,
and run in worker processes; those that cannot run say why."""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

from rlcollect import Collector
from rlcollect.collectors import MultiSyncCollector
from rlcollect.collectors.policy.holder import PolicyHolder
from rlcollect.envs import GymEnv
from tests.collectors.policy.lazy_policies import (
    initialised,
    lazy_head_env_ours,
    lazy_head_env_torchrl,
    lazy_head_policy,
    meta_twin_env,
    meta_twin_policy,
    real_weights,
)
from tests.collectors.single.torchrl_parity import assert_same_batches

torchrl_collectors = pytest.importorskip("torchrl.collectors")

FRAMES_PER_BATCH = 40
TOTAL_FRAMES = 120
KINDS = ["gru", "lstm"]


def seeded(env: object) -> object:
    env.set_seed(0)  # type: ignore[attr-defined]
    return env


def collect(collector: object, updates: dict[int, object] | None = None) -> list[TensorDictBase]:
    """Every batch of `collector`; before batch i, `update_policy_weights_(updates[i])`."""
    updates = updates or {}
    batches = []
    try:
        for index in range(TOTAL_FRAMES // FRAMES_PER_BATCH):
            if index in updates:
                collector.update_policy_weights_(updates[index])  # type: ignore[attr-defined]
            batches.append(collector.next())  # type: ignore[attr-defined]
    finally:
        collector.shutdown()  # type: ignore[attr-defined]
    return batches


def both_collectors(kind: str, family: str) -> tuple[object, object, nn.Module]:
    """Our collector and TorchRL's over the same seeded CartPole, each with its own copy of
    the same policy (ours last, returned too)."""
    if family == "meta_twin":
        theirs_env, ours_env, build = meta_twin_env(), meta_twin_env(), meta_twin_policy
    else:
        theirs_env, ours_env, build = (
            lazy_head_env_torchrl(kind),
            lazy_head_env_ours(),
            lazy_head_policy,
        )
    options = {"frames_per_batch": FRAMES_PER_BATCH, "total_frames": TOTAL_FRAMES}
    theirs = torchrl_collectors.Collector(seeded(theirs_env), build(kind), **options)
    policy = build(kind)
    ours = Collector(seeded(ours_env), policy, **options)
    return ours, theirs, policy


def comparable(mine: list[TensorDictBase], reference: list[TensorDictBase]) -> list[TensorDictBase]:
    """Our batches with TorchRL's keys: its collector leaves out the outputs of a policy
    holding meta tensors that are no action ("embed", "logits"), which ours keeps."""
    ours_only = set(mine[0].keys(True, True)) - set(reference[0].keys(True, True))
    assert ours_only <= {"embed", "logits"}, ours_only
    return [batch.exclude(*ours_only) for batch in mine]


# --- collection, side by side with TorchRL -------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_benchmarl_shaped_policy_with_a_meta_twin_collects_as_torchrl(kind: str) -> None:
    ours, theirs, _ = both_collectors(kind, "meta_twin")
    mine, reference = collect(ours), collect(theirs)
    assert_same_batches(comparable(mine, reference), reference)
    assert any(bool(batch["next", "done"].any()) for batch in mine), "no episode ended"
    # The state went round: the policy's output at a step depends on the one before.
    assert not torch.equal(mine[0]["embed"][1], mine[0]["embed"][0])


@pytest.mark.parametrize("kind", KINDS)
def test_recurrent_module_with_a_lazy_head_collects_as_torchrl(kind: str) -> None:
    ours, theirs, policy = both_collectors(kind, "lazy_head")
    assert not any(nn.parameter.is_lazy(p) for p in policy.parameters()), "not initialised"
    mine, reference = collect(ours), collect(theirs)
    assert_same_batches(mine, reference)
    state_key = "recurrent_state_h" if kind == "lstm" else "recurrent_state"
    assert mine[0][state_key][1:].abs().sum() > 0


def test_meta_tensors_stay_on_the_meta_device_and_out_of_the_weights() -> None:
    policy = meta_twin_policy("gru")
    collector = Collector(seeded(meta_twin_env()), policy, frames_per_batch=10, total_frames=10)
    try:
        twin = collector.policy[0]._empty_cell
        assert all(p.is_meta for p in twin.parameters())
        assert collector.policy is policy  # on its device already: used as given
        state = collector.state_dict()["policy_state_dict"]
        assert {name for name, t in state.items() if t.is_meta}  # the checkpoint keeps them
        collector.load_state_dict(collector.state_dict())
    finally:
        collector.shutdown()


def test_a_copy_for_another_device_keeps_the_meta_twin_and_follows_the_given_policy() -> None:
    """The line that raised "Cannot copy out of meta tensor": a policy whose tensors are not
    on the policy device is copied there (`cpu:0` differs from `cpu` as a device, so the
    copy is made on a machine without accelerator too)."""
    policy = meta_twin_policy("gru")
    holder = PolicyHolder(policy, ["observation"], torch.device("cpu", 0))
    held = holder.module
    assert held is not policy
    assert all(p.is_meta for p in held[0]._empty_cell.parameters())
    assert held[0].params is not policy[0].params
    with torch.no_grad():
        policy[1].module.weight.add_(1.0)
    holder.update()  # no weights: copied again from the policy given
    assert torch.equal(held[1].module.weight, policy[1].module.weight)
    for name, value in real_weights(policy).items():
        assert torch.equal(held.state_dict()[name], value), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_policy_copied_to_the_gpu_keeps_its_meta_twin_and_collects() -> None:
    policy = meta_twin_policy("gru")
    collector = Collector(
        seeded(meta_twin_env()), policy, policy_device="cuda", frames_per_batch=10, total_frames=-1
    )
    try:
        held = collector.policy
        assert all(p.is_meta for p in held[0]._empty_cell.parameters())
        assert {t.device.type for t in real_weights(held).values()} == {"cuda"}
        with torch.no_grad():
            policy[1].module.weight.add_(1.0)
        collector.update_policy_weights_()
        assert torch.equal(held[1].module.weight.cpu(), policy[1].module.weight)
        assert collector.next()["logits"].abs().sum() > 0
    finally:
        collector.shutdown()


BENCHMARL_MISSING = [n for n in ("benchmarl", "vmas") if importlib.util.find_spec(n) is None]
SIDE_BY_SIDE = Path(__file__).with_name("benchmarl_recurrent_side_by_side.py")


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.usefixtures("nothing_left_at_os_level")
@pytest.mark.parametrize("kind", KINDS)
def test_benchmarl_gru_and_lstm_policies_collect_as_on_torchrl(kind: str, tmp_path: Path) -> None:
    """BenchMARL's own models (MAPPO on VMAS balance), in a process of their own (run in
    `tmp_path`: BenchMARL writes its experiment folder into the working directory)."""
    if BENCHMARL_MISSING:
        if os.environ.get("RLCOLLECT_FULL_TEST_INSTALL") == "1":
            pytest.fail(f"{BENCHMARL_MISSING} not installed (docs/guide/benchmarl.md)")
        pytest.skip(f"{BENCHMARL_MISSING} not installed (docs/guide/benchmarl.md)")
    done = subprocess.run(
        [sys.executable, str(SIDE_BY_SIDE.resolve()), kind],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "same batches: 2 of torch.Size([4, 20])" in done.stdout, done.stdout


# --- weight updates ------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["meta_twin", "lazy_head"])
@pytest.mark.parametrize("kind", KINDS)
def test_weight_update_reaches_the_policy_as_on_torchrl(kind: str, family: str) -> None:
    """The same TensorDict of new weights, sent after the first batch, gives both
    collectors the same next batches (for a lazy head: into its parameters, initialised)."""
    build = meta_twin_policy if family == "meta_twin" else lazy_head_policy
    trained = initialised(build(kind, seed=1))
    ours, theirs, policy = both_collectors(kind, family)
    update = {1: TensorDict.from_module(trained)}
    mine, reference = collect(ours, update), collect(theirs, update)
    assert_same_batches(comparable(mine, reference), reference)
    for name, value in real_weights(trained).items():
        assert torch.equal(policy.state_dict()[name], value), name


@pytest.mark.parametrize("form", ["module", "state_dict", "tensordict"])
@pytest.mark.parametrize("family", ["meta_twin", "lazy_head"])
def test_every_form_of_weights_reaches_the_policy(family: str, form: str) -> None:
    build = meta_twin_policy if family == "meta_twin" else lazy_head_policy
    env = meta_twin_env() if family == "meta_twin" else lazy_head_env_ours()
    trained = initialised(build("gru", seed=1))
    weights = {
        "module": trained,
        "state_dict": trained.state_dict(),
        "tensordict": TensorDict.from_module(trained),
    }[form]
    policy = build("gru")
    collector = Collector(seeded(env), policy, frames_per_batch=10, total_frames=-1)
    try:
        collector.update_policy_weights_(weights)
        for name, value in real_weights(trained).items():
            assert torch.equal(collector.policy.state_dict()[name], value), name
        collector.next()
    finally:
        collector.shutdown()


# --- worker processes ----------------------------------------------------------------------------


def first_step_logits(
    policy: nn.Module, batch: TensorDictBase
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's logits at the first step of each episode (where the state is zero), and
    what `policy` computes there."""
    frames = batch.reshape(-1)
    first = frames[frames["is_init"].flatten()]
    inputs = first.select("observation", "is_init").clone()
    inputs.set("_hidden_gru_0", torch.zeros(len(first), 8))
    with torch.no_grad():
        return first["logits"], policy(inputs)["logits"]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.usefixtures("no_leftover_children")
def test_multisync_workers_run_the_meta_twin_policy_and_take_updates() -> None:
    """TorchRL's `MultiSyncCollector` collects with it too (without the policy's outputs)."""
    trained = meta_twin_policy("gru", seed=1)
    collector = MultiSyncCollector(
        [meta_twin_env, meta_twin_env],
        meta_twin_policy("gru"),
        frames_per_batch=80,
        total_frames=-1,
        mp_start_method="spawn",
    )
    try:
        before = collector.next()
        assert before.batch_size == (2, 40)
        collected, computed = first_step_logits(meta_twin_policy("gru"), before)
        torch.testing.assert_close(collected, computed)  # one frame vs a batch: rounding
        collector.update_policy_weights_(TensorDict.from_module(trained))
        collected, computed = first_step_logits(trained, collector.next())
        torch.testing.assert_close(collected, computed)  # one frame vs a batch: rounding
    finally:
        collector.shutdown()


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children")
def test_multisync_refuses_lazy_parameters_it_cannot_send() -> None:
    """The workers would each initialise their own: the parent has no weights to send
    (TorchRL's `MultiSyncCollector` fails in its workers with this policy)."""
    with pytest.raises(
        ValueError,
        match=r"lazy parameters \['module.1.module.weight', 'module.1.module.bias'\] are not ini",
    ):
        MultiSyncCollector(
            [lazy_head_env_ours, lazy_head_env_ours],
            lazy_head_policy("gru"),
            frames_per_batch=80,
            total_frames=-1,
            mp_start_method="spawn",
        )


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.usefixtures("no_leftover_children")
def test_multisync_workers_build_a_lazy_policy_from_a_factory_and_take_updates() -> None:
    """What the refusal above suggests: the workers initialise it, the parent learns the
    weights' layout from them and checks updates against it."""
    trained = initialised(lazy_head_policy("gru", seed=1))
    collector = MultiSyncCollector(
        [lazy_head_env_ours, lazy_head_env_ours],
        policy_factory=functools.partial(lazy_head_policy, "gru"),
        frames_per_batch=80,
        total_frames=-1,
        mp_start_method="spawn",
    )
    try:
        assert collector.next().batch_size == (2, 40)
        collector.update_policy_weights_(TensorDict.from_module(trained))
        batch = collector.next()
        with torch.no_grad():
            expected = trained[1](batch.select("embed").clone())["logits"]
        torch.testing.assert_close(batch["logits"], expected)
        with pytest.raises(ValueError, match="has shape"):
            collector.update_policy_weights_(
                {**trained.state_dict(), "module.1.module.bias": torch.zeros(3)}
            )
    finally:
        collector.shutdown()


# --- policies that cannot run --------------------------------------------------------------------


def test_a_policy_without_data_says_which_tensors_lack_it() -> None:
    """TorchRL's collector builds and fails at the first batch; ours says why, at once."""
    policy = TensorDictModule(
        nn.Linear(3, 1, device="meta"), in_keys=["observation"], out_keys=["action"]
    )
    with pytest.raises(
        ValueError, match=r"tensors \['module.weight', 'module.bias'\] are on the meta device"
    ):
        Collector(GymEnv("Pendulum-v1"), policy, frames_per_batch=10, total_frames=10)


def test_lazy_parameters_that_cannot_be_initialised_are_named() -> None:
    """A 1-D convolution cannot take Pendulum's flat observation: its sizes stay unknown."""
    policy = TensorDictModule(nn.LazyConv1d(1, 1), in_keys=["observation"], out_keys=["action"])
    with pytest.raises(
        ValueError,
        match=r"lazy parameters \['module.weight', 'module.bias'\] could not be initialised",
    ):
        Collector(GymEnv("Pendulum-v1"), policy, frames_per_batch=10, total_frames=10)

"""TorchRL's remaining constructor arguments, each against TorchRL's own collector where TorchRL
has the feature: compile_policy, cudagraph_policy, no_cuda_sync, interruptor, use_buffers=False,
local_init_rb, weight_updater, and envs whose done flags are not boolean."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch._dynamo.eval_frame import OptimizedModule

from rlcollect import Collector, keys
from rlcollect.envs import GymEnv
from tests.collectors.policies import bias_module, greedy_module
from tests.collectors.single.float_done_env import FloatDoneEnv
from tests.collectors.single.torchrl_parity import assert_same_batches, collect_both

torchrl_collectors = pytest.importorskip("torchrl.collectors")
torchrl_envs = pytest.importorskip("torchrl.envs")
torchrl_data = pytest.importorskip("torchrl.data")

pytestmark = pytest.mark.timeout(300)


def cartpole_collector(frames: int = 20, total: int = 60, **options: object) -> Collector:
    env = GymEnv("CartPole-v1")
    env.set_seed(3)
    return Collector(env, greedy_module(), frames_per_batch=frames, total_frames=total, **options)


class CountingBackend:
    """A `torch.compile` backend that counts the graphs it is given and the calls they get."""

    def __init__(self) -> None:
        self.graphs = 0
        self.calls = 0

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list) -> object:
        self.graphs += 1

        def run(*args: object) -> object:
            self.calls += 1
            return graph.forward(*args)

        return run


# --- compile_policy -------------------------------------------------------------------------------


def test_compile_policy_runs_every_step_through_the_compiled_module() -> None:
    backend = CountingBackend()
    collector = cartpole_collector(compile_policy={"backend": backend, "warmup": 1})
    plain = cartpole_collector()
    try:
        assert isinstance(collector.loop.policy_step._module, OptimizedModule)
        compiled_batches = list(collector)
        plain_batches = list(plain)
    finally:
        collector.shutdown()
        plain.shutdown()
    assert backend.graphs >= 1
    assert backend.calls == 60  # one compiled call per step, none left to the plain module
    assert_same_batches(compiled_batches, plain_batches)


def test_compile_policy_follows_weight_updates() -> None:
    backend = CountingBackend()
    collector = cartpole_collector(compile_policy={"backend": backend})
    try:
        first = collector.next()
        flipped = greedy_module()
        with torch.no_grad():
            flipped.module.linear.weight.neg_()
        collector.update_policy_weights_(flipped)
        second = collector.next()
    finally:
        collector.shutdown()
    # A policy whose scores are negated picks the other action on the same observation.
    observation = second["observation"]
    expected = greedy_module().module(observation).argmax(-1)
    assert torch.equal(second["action"].argmax(-1), 1 - expected)
    assert first["action"].shape == second["action"].shape
    assert backend.calls == 40


def test_compile_policy_matches_torchrl() -> None:
    ours, theirs = collect_both(compile_policy={"backend": "eager"})
    assert_same_batches(ours, theirs)


@pytest.mark.slow
def test_compile_policy_true_compiles_with_the_default_backend() -> None:
    collector = cartpole_collector(compile_policy=True)
    plain = cartpole_collector()
    try:
        assert isinstance(collector.loop.policy_step._module, OptimizedModule)
        assert_same_batches(list(collector), list(plain))
    finally:
        collector.shutdown()
        plain.shutdown()


def test_compile_policy_on_the_tensordict_path() -> None:
    """A policy that is not a plain module in a TensorDictModule is compiled whole."""
    from tensordict.nn import TensorDictSequential

    backend = CountingBackend()
    policy = TensorDictSequential(greedy_module())
    env = GymEnv("CartPole-v1")
    collector = Collector(
        env, policy, frames_per_batch=10, total_frames=10, compile_policy={"backend": backend}
    )
    try:
        batch = collector.next()
    finally:
        collector.shutdown()
    assert isinstance(collector.loop.policy_step._policy, OptimizedModule)
    assert batch["action"].shape == (10, 2)
    assert backend.graphs >= 1


@pytest.mark.parametrize("name", ["compile_policy", "cudagraph_policy"])
def test_compile_options_of_the_wrong_type_are_refused(name: str) -> None:
    match = rf"{name} must be True, False, None or a dict .* got 'yes'"
    with pytest.raises(TypeError, match=match):
        Collector("CartPole-v1", frames_per_batch=4, **{name: "yes"})


# --- cudagraph_policy and no_cuda_sync (this machine has no CUDA) ---------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="what happens without CUDA")
def test_cudagraph_policy_without_cuda_warns_and_runs_the_policy_as_torchrl_does() -> None:
    """TorchRL wraps the policy in `CudaGraphModule`, which without CUDA warns and calls the
    policy as it is; so its batches are those of its plain collector (building TorchRL's
    wrapper here would take TensorDicts out of torch's pytree for the rest of the session)."""
    with pytest.warns(UserWarning, match=r"cudagraph_policy=True needs CUDA, which is not avail"):
        ours = cartpole_collector(frames=150, total=600, cudagraph_policy=True)
    plain = cartpole_collector(frames=150, total=600)
    try:
        assert ours.loop.policy_step._module is ours.policy.module  # not wrapped
        assert_same_batches(list(ours), list(plain))
    finally:
        ours.shutdown()
        plain.shutdown()
    _, theirs = collect_both()
    reference_env = GymEnv("CartPole-v1")
    reference_env.set_seed(7)
    with pytest.warns(UserWarning, match=r"cudagraph_policy=\{'warmup': 2\} needs CUDA"):
        mine = Collector(
            reference_env,
            greedy_module(),
            frames_per_batch=150,
            total_frames=600,
            cudagraph_policy={"warmup": 2},
        )
    try:
        assert_same_batches(list(mine), theirs)
    finally:
        mine.shutdown()


def test_no_cuda_sync_is_accepted_and_changes_nothing_on_cpu() -> None:
    ours, theirs = collect_both(no_cuda_sync=True)
    assert_same_batches(ours, theirs)
    with pytest.raises(TypeError, match=r"no_cuda_sync must be True or False; got 'no'"):
        Collector("CartPole-v1", frames_per_batch=4, no_cuda_sync="no")


# --- interruptor ----------------------------------------------------------------------------------


class StopAtPolls:
    """An interruptor answering True at the given polls (counted from 1): the collectors poll
    it once per env step, so both stop at the same step."""

    def __init__(self, *polls: int) -> None:
        self.polls = set(polls)
        self.count = 0

    def collection_stopped(self) -> bool:
        self.count += 1
        return self.count in self.polls


def test_interruptor_cuts_a_batch_as_torchrl_does() -> None:
    # Batches of 150 steps, polled once a step: the first is cut after 40 steps (poll 40), the
    # third after 10 (poll 40 + 150 + 10).
    ours_env = GymEnv("CartPole-v1")
    ours_env.set_seed(7)
    theirs_env = torchrl_envs.GymEnv("CartPole-v1")
    theirs_env.set_seed(7)
    options = {"frames_per_batch": 150, "total_frames": 600}
    mine = Collector(ours_env, greedy_module(), interruptor=StopAtPolls(40, 200), **options)
    reference = torchrl_collectors.Collector(
        theirs_env, greedy_module(), interruptor=StopAtPolls(40, 200), **options
    )
    try:
        ours, theirs = list(mine), list(reference)
    finally:
        mine.shutdown()
        reference.shutdown()
    for index, cut in ((0, 40), (2, 10)):
        mine, reference = ours[index], theirs[index]
        assert torch.equal(mine[keys.TRAJ_IDS], reference[keys.TRAJ_IDS])
        assert bool((mine[keys.TRAJ_IDS][cut:] == -1).all())
        assert bool((mine[keys.TRAJ_IDS][:cut] >= 0).all())
        assert_same_batches([mine[:cut]], [reference[:cut]])
    # A batch after a cut goes on from where it stopped, in both.
    assert_same_batches([ours[1], ours[3]], [theirs[1], theirs[3]])


def test_interruptor_cut_counts_episodes_and_ids_from_the_collected_steps_only() -> None:
    from rlcollect.testing import CountingEnv

    collector = Collector(
        CountingEnv(episode_length=3),
        frames_per_batch=10,
        total_frames=20,
        interruptor=StopAtPolls(4),
    )
    first, second = list(collector)
    collector.shutdown()
    assert first[keys.TRAJ_IDS].tolist() == [0, 0, 0, 1] + [-1] * 6
    # Step 4 started a new episode at count 1; the next batch goes on from there.
    assert second["observation"][:3, 0].tolist() == [1.0, 2.0, 0.0]
    assert second[keys.TRAJ_IDS].tolist() == [1, 1, 2, 2, 2, 3, 3, 3, 4, 4]
    assert collector.stats()["episodes"] == 4


def test_interruptor_with_torchrls_interruptor_class() -> None:
    from torchrl.collectors._constants import _Interruptor

    interruptor = _Interruptor()
    interruptor.stop_collection()  # stopped before the batch: one step is collected
    collector = cartpole_collector(frames=10, total=10, interruptor=interruptor)
    batch = collector.next()
    collector.shutdown()
    assert batch[keys.TRAJ_IDS].tolist() == [0] + [-1] * 9


def test_bad_interruptors_are_refused() -> None:
    with pytest.raises(TypeError, match=r"interruptor must have a collection_stopped\(\) method"):
        Collector("CartPole-v1", frames_per_batch=4, interruptor=object())
    with pytest.raises(ValueError, match=r"interruptor cannot be used with trajs_per_batch"):
        Collector("CartPole-v1", frames_per_batch=4, interruptor=StopAtPolls(), trajs_per_batch=2)


# --- use_buffers, local_init_rb, weight_updater ---------------------------------------------------


def test_use_buffers_false_gives_torchrls_batches() -> None:
    ours, theirs = collect_both(use_buffers=False)
    assert_same_batches(ours, theirs)


@pytest.mark.parametrize("value", [None, True, False])
def test_local_init_rb_is_accepted(value: bool | None) -> None:
    from rlcollect.replay import LazyTensorStorage, ReplayBuffer

    buffer = ReplayBuffer(storage=LazyTensorStorage(100))
    collector = cartpole_collector(frames=10, total=20, replay_buffer=buffer, local_init_rb=value)
    for _ in collector:
        pass
    collector.shutdown()
    assert len(buffer) == 20


def test_local_init_rb_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(TypeError, match=r"local_init_rb must be True, False or None; got 'x'"):
        Collector("CartPole-v1", frames_per_batch=4, local_init_rb="x")


@pytest.mark.parametrize("side", ["ours", "torchrl"])
def test_weight_updater_is_handed_every_update_as_in_torchrl(side: str) -> None:
    """TorchRL's legacy `weight_updater=`: the collector registers with it and
    `update_policy_weights_` hands it the update (here TorchRL's `VanillaWeightUpdater`,
    which reads the trainer's weights and writes them into the collector's policy)."""
    policy, trainer = bias_module(0.5), bias_module(1.5)
    updater = torchrl_collectors.VanillaWeightUpdater(
        weight_getter=lambda: TensorDict.from_module(trainer).data,
        policy_weights=TensorDict.from_module(policy).data,
    )
    cls = Collector if side == "ours" else torchrl_collectors.Collector
    env = GymEnv("Pendulum-v1") if side == "ours" else torchrl_envs.GymEnv("Pendulum-v1")
    collector = cls(env, policy, frames_per_batch=4, total_frames=-1, weight_updater=updater)
    try:
        assert collector.weight_updater is updater
        assert updater.collector is collector
        assert torch.all(collector.next()["action"] == 0.5)
        collector.update_policy_weights_()  # the updater reads the trainer's weights
        assert torch.all(collector.next()["action"] == 1.5)
        collector.update_policy_weights_(TensorDict.from_module(bias_module(-1.0)).data)
        assert torch.all(collector.next()["action"] == -1.0)
        with pytest.raises(ValueError, match=r"model_id"):
            collector.update_policy_weights_(trainer, model_id="value")
    finally:
        collector.shutdown()


@pytest.mark.parametrize(
    ("updater", "error", "match"),
    [
        (42, TypeError, r"weight_updater must be a TorchRL WeightUpdaterBase .*; got int"),
        (lambda: None, TypeError, r"callable with no argument that builds one; got NoneType"),
    ],
)
def test_what_is_not_a_weight_updater_is_refused(updater: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Collector("CartPole-v1", frames_per_batch=4, weight_updater=updater)
    collector = Collector("CartPole-v1", frames_per_batch=4, weight_updater=None)
    assert collector.weight_updater is None
    collector.shutdown()


# --- done flags that are not boolean --------------------------------------------------------------


def test_float_done_flags_end_episodes_as_in_torchrl() -> None:
    ours = Collector(FloatDoneEnv(), frames_per_batch=8, total_frames=16)
    theirs = torchrl_collectors.Collector(FloatDoneEnv(), frames_per_batch=8, total_frames=16)
    try:
        mine, reference = list(ours), list(theirs)
    finally:
        ours.shutdown()
        theirs.shutdown()
    assert mine[0]["next", "done"].dtype == torch.float32
    assert mine[0]["next", "observation"][:, 0].tolist() == [1, 2, 3, 1, 2, 3, 1, 2]
    assert mine[1][keys.TRAJ_IDS].tolist() == [2, 3, 3, 3, 4, 4, 4, 5]
    for batch, expected in zip(mine, reference, strict=True):
        for key in [("next", "observation"), ("next", "done"), keys.TRAJ_IDS, "done"]:
            assert torch.equal(batch[key], expected[key]), key

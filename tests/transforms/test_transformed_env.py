"""Tests for TransformedEnv: both faces, specs, partial resets, delegation and TorchRL parity."""

from __future__ import annotations

import pytest
import torch
from torchrl.envs import CatFrames as TorchRLCatFrames
from torchrl.envs import Compose as TorchRLCompose
from torchrl.envs import GymEnv as TorchRLGymEnv
from torchrl.envs import InitTracker as TorchRLInitTracker
from torchrl.envs import ObservationNorm as TorchRLObservationNorm
from torchrl.envs import RewardSum as TorchRLRewardSum
from torchrl.envs import StepCounter as TorchRLStepCounter
from torchrl.envs import TransformedEnv as TorchRLTransformedEnv

from rlcollect.collectors import Collector
from rlcollect.envs import GymEnv, SerialEnv
from rlcollect.errors import MisuseError
from rlcollect.keys import EPISODE_REWARD, IS_INIT, NEXT, OBSERVATION, RESET, STEP_COUNT
from rlcollect.testing import check_env
from rlcollect.transforms import (
    CatFrames,
    Compose,
    InitTracker,
    ObservationNorm,
    RewardSum,
    StepCounter,
    Transform,
    TransformedEnv,
)
from tests.transforms.transform_parity import (
    BATCHED_CARTPOLE_ACTIONS,
    CARTPOLE_ACTIONS,
    COUNTING_ENVS,
    assert_faces_agree,
    assert_same_entries,
    counting_actions,
    episode_ends,
    run_steps,
)


def all_transforms() -> Compose:
    return Compose(
        StepCounter(max_steps=6),
        RewardSum(),
        InitTracker(),
        ObservationNorm(loc=0.5, scale=2.0, out_keys=["normalized"]),
        CatFrames(3, in_keys=["normalized"]),
    )


def test_composed_transforms_match_torchrl() -> None:
    reference = TorchRLTransformedEnv(
        TorchRLGymEnv("CartPole-v1"),
        TorchRLCompose(
            TorchRLStepCounter(6),
            TorchRLRewardSum(),
            TorchRLInitTracker(),
            TorchRLObservationNorm(0.5, 2.0, in_keys=[OBSERVATION], out_keys=["normalized"]),
            TorchRLCatFrames(3, dim=-1, in_keys=["normalized"]),
        ),
    )
    ours = run_steps(TransformedEnv(GymEnv("CartPole-v1"), all_transforms()), CARTPOLE_ACTIONS)
    theirs = run_steps(reference, CARTPOLE_ACTIONS)
    assert episode_ends(ours) >= 5
    assert set(ours.keys(True, True)) == set(theirs.keys(True, True))
    assert_same_entries(ours, theirs, list(theirs.keys(True, True)))


def test_buffer_face_agrees_with_tensordict_face() -> None:
    assert_faces_agree(TransformedEnv(GymEnv("CartPole-v1"), all_transforms()), CARTPOLE_ACTIONS)
    batched = TransformedEnv(SerialEnv(3, "CartPole-v1"), all_transforms())
    assert_faces_agree(batched, BATCHED_CARTPOLE_ACTIONS)
    for make_env in COUNTING_ENVS.values():
        assert_faces_agree(TransformedEnv(make_env(), all_transforms()), counting_actions(15))


def test_check_env_passes_with_every_transform() -> None:
    check_env(TransformedEnv(GymEnv("CartPole-v1"), all_transforms()), steps=30)
    check_env(TransformedEnv(SerialEnv(3, "CartPole-v1"), all_transforms()), steps=30)
    for make_env in COUNTING_ENVS.values():
        check_env(TransformedEnv(make_env(), all_transforms()), steps=15)


@pytest.mark.parametrize("make_env", COUNTING_ENVS.values(), ids=COUNTING_ENVS.keys())
def test_partial_reset_changes_only_the_masked_sub_envs(make_env: object) -> None:
    env = TransformedEnv(make_env(), all_transforms())
    root = env.reset()
    for _ in range(2):
        _, root = env.step_and_maybe_reset(env.rand_action(root))
    before = root.clone()
    mask = torch.tensor([[False], [True], [False]])
    after = env.reset(root.clone().set(RESET, mask))
    for key in (OBSERVATION, STEP_COUNT, EPISODE_REWARD, IS_INIT, "normalized"):
        assert torch.equal(after[key][0], before[key][0]), key
        assert torch.equal(after[key][2], before[key][2]), key
    assert after[STEP_COUNT][1].item() == 0
    assert after[EPISODE_REWARD][1].item() == 0.0
    assert after[IS_INIT][1].item()


def test_specs_are_transformed_and_the_base_specs_untouched() -> None:
    base = GymEnv("CartPole-v1")
    base_observation = base.observation_spec.clone()
    env = TransformedEnv(base, all_transforms())
    assert set(env.observation_spec.keys()) == {
        OBSERVATION,
        STEP_COUNT,
        EPISODE_REWARD,
        IS_INIT,
        "normalized",
    }
    assert env.observation_spec["normalized"].shape == torch.Size([12])
    assert base.observation_spec == base_observation
    full = env.full_spec
    assert (NEXT, STEP_COUNT) in full
    assert STEP_COUNT in full
    assert env.action_spec == base.action_spec


def test_append_transform_recomputes_specs() -> None:
    env = TransformedEnv(GymEnv("CartPole-v1"))
    assert STEP_COUNT not in env.observation_spec
    env.reset()
    assert env.append_transform(StepCounter()) is env
    assert STEP_COUNT in env.observation_spec
    assert env.reset()[STEP_COUNT].tolist() == [0]
    assert_faces_agree(env, CARTPOLE_ACTIONS[:12])


def test_nested_transformed_envs() -> None:
    inner = TransformedEnv(GymEnv("CartPole-v1"), StepCounter())
    env = TransformedEnv(inner, RewardSum())
    data = run_steps(env, CARTPOLE_ACTIONS)
    assert torch.equal(data[NEXT, EPISODE_REWARD], data[NEXT, STEP_COUNT].float())
    assert_faces_agree(env, CARTPOLE_ACTIONS)


def test_set_seed_and_close_delegate_to_the_base_env() -> None:
    base = GymEnv("CartPole-v1")
    env = TransformedEnv(base, StepCounter())
    assert env.base_env is base
    assert env.set_seed(5) == base.set_seed(5)
    env.set_seed(5)
    first = env.reset()[OBSERVATION]
    env.set_seed(5)
    assert torch.equal(env.reset()[OBSERVATION], first)
    env.close()
    assert base.is_closed
    with pytest.raises(MisuseError, match="closed"):
        env.reset()


def test_parent_is_the_env_before_the_transform() -> None:
    counter, summed = StepCounter(), RewardSum()
    assert counter.parent is None
    base = GymEnv("CartPole-v1")
    env = TransformedEnv(base, Compose(counter, summed))
    assert counter.parent is base
    assert STEP_COUNT in summed.parent.observation_spec
    assert EPISODE_REWARD not in summed.parent.observation_spec
    assert counter.container is env.transform


def test_parent_inside_a_nested_compose() -> None:
    tracker = InitTracker()
    env = TransformedEnv(
        GymEnv("CartPole-v1"), Compose(StepCounter(), Compose(RewardSum(), tracker))
    )
    seen = tracker.parent.observation_spec
    assert STEP_COUNT in seen
    assert EPISODE_REWARD in seen
    assert IS_INIT not in seen
    assert IS_INIT in env.observation_spec


def test_attaching_many_transforms_stays_cheap() -> None:
    # every transform's spec hook builds its parent view: without caching this is 2**n work
    stacks = [CatFrames(2, out_keys=[f"stacked_{index}"]) for index in range(25)]
    env = TransformedEnv(GymEnv("CartPole-v1"), Compose(StepCounter(), *stacks, RewardSum()))
    assert len(env.observation_spec.keys()) == 28


def test_stateless_transforms_have_an_empty_state_dict() -> None:
    env = TransformedEnv(GymEnv("CartPole-v1"), Compose(StepCounter(), RewardSum()))
    assert env.state_dict() == {}
    env.load_state_dict({})


def test_rejects_foreign_envs_and_transforms() -> None:
    with pytest.raises(TypeError, match="wraps an rlcollect EnvBase"):
        TransformedEnv(TorchRLGymEnv("CartPole-v1"), StepCounter())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected an rlcollect Transform"):
        TransformedEnv(GymEnv("CartPole-v1"), TorchRLStepCounter())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected an rlcollect Transform"):
        Compose(StepCounter(), "RewardSum")  # type: ignore[arg-type]


def test_custom_transform_with_inv_sees_the_action_first() -> None:
    class FlipAction(Transform):
        def inv(self, tensordict):  # type: ignore[no-untyped-def]
            return tensordict.set("action", tensordict.get("action").flip(-1))

    ours = run_steps(TransformedEnv(GymEnv("CartPole-v1"), FlipAction()), CARTPOLE_ACTIONS)
    flipped = [action.flip(-1) for action in CARTPOLE_ACTIONS]
    reference = run_steps(GymEnv("CartPole-v1"), flipped)
    assert torch.equal(ours[NEXT, OBSERVATION], reference[NEXT, OBSERVATION])
    assert torch.equal(ours["action"], torch.stack(CARTPOLE_ACTIONS))


def test_collector_batches_carry_the_transform_keys() -> None:
    def make_env() -> TransformedEnv:
        return TransformedEnv(
            GymEnv("CartPole-v1"), Compose(StepCounter(8), RewardSum(), InitTracker())
        )

    collector = Collector(make_env, frames_per_batch=40, total_frames=80)
    for batch in collector:
        assert torch.equal(batch[NEXT, STEP_COUNT], batch[STEP_COUNT] + 1)
        assert torch.equal(batch[IS_INIT], batch[STEP_COUNT] == 0)
        assert torch.equal(batch[NEXT, EPISODE_REWARD], batch[NEXT, STEP_COUNT].float())
        assert batch[NEXT, STEP_COUNT].max() <= 8
    collector.shutdown()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_runs_on_cuda() -> None:
    from rlcollect.testing import CountingEnv

    base = CountingEnv(episode_length=(2, 3, 5), batch_size=(3,), device="cuda")
    env = TransformedEnv(base, all_transforms())
    check_env(env, steps=15)
    data = run_steps(env, [action.cuda() for action in counting_actions(10)])
    assert data[NEXT, STEP_COUNT].device.type == "cuda"
    running = TransformedEnv(base, ObservationNorm(running=True, out_keys=["normalized"]))
    assert run_steps(running, counting_actions(10))["normalized"].device.type == "cuda"

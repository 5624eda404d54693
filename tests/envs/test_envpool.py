"""Tests of `EnvPoolEnv` on real EnvPool tasks: our Collector's batches against EnvPool's own
loop replayed with the same actions, TorchRL's `MultiThreadedEnv` keys and flags, and errors."""

from __future__ import annotations

import sys
from typing import Any

import gymnasium
import pytest
import torch
from tensordict import TensorDictBase

from rlcollect import Collector, keys
from rlcollect.testing import check_env
from rlcollect.testing.next_step_replay import assert_batch_matches_replay, replay_next_step_loop
from rlcollect.transforms import StepCounter, TransformedEnv

envpool = pytest.importorskip("envpool")
# The plain pools of the tests: EnvPool declares float32 boxes with float64 bounds.
pytestmark = pytest.mark.filterwarnings("ignore:.*precision lowered:UserWarning")

from rlcollect.envs.base import EnvBase  # noqa: E402
from rlcollect.envs.envpool_env import EnvPoolEnv  # noqa: E402
from rlcollect.envs.envpool_pools import StateLayout  # noqa: E402

SEED = 3


def collect(env: EnvBase, steps: int, batches: int) -> TensorDictBase:
    """`batches` batches of `steps` steps per env from our Collector (random actions), joined
    along time."""
    collector = Collector(
        env,
        None,
        frames_per_batch=env.batch_size.numel() * steps,
        total_frames=env.batch_size.numel() * steps * batches,
    )
    data = torch.cat([batch.clone() for batch in collector], dim=1)
    collector.shutdown()
    return data


CASES = [
    pytest.param("CartPole-v1", 8, None, {}, 60, id="cartpole-sync"),
    pytest.param("CartPole-v1", 8, 4, {}, 60, id="cartpole-send-recv"),
    pytest.param("Pong-v5", 4, 2, {"max_episode_steps": 25}, 40, id="pong-send-recv"),
    pytest.param("HalfCheetah-v4", 4, 2, {"max_episode_steps": 15}, 30, id="mujoco-send-recv"),
]


def check_against_replay(
    env_id: str,
    num_envs: int,
    batch_size: int | None,
    make_kwargs: dict[str, Any],
    steps: int,
    direct: bool,
) -> None:
    """Our Collector's batches over `EnvPoolEnv` equal EnvPool's own loop replayed with the
    same actions; `direct` says which path the pools must take (see `Pool`)."""
    env = EnvPoolEnv(env_id, num_envs, batch_size=batch_size, seed=SEED, **make_kwargs)
    assert [pool.is_direct for pool in env._pools] == [direct] * len(env._pools)
    data = collect(env, steps // 2, batches=2)
    env.close()
    assert data.batch_size == (num_envs, steps)  # every frame is a transition
    pool = envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=SEED, **make_kwargs)
    observation, _ = pool.reset()
    replay = replay_next_step_loop(pool, observation, data[keys.ACTION].numpy())
    pool.close()
    ends = assert_batch_matches_replay(data, replay)
    assert ends > 0, "the case must reach episode ends to test the next-step autoreset"


@pytest.mark.parametrize(("env_id", "num_envs", "batch_size", "make_kwargs", "steps"), CASES)
def test_collector_batches_equal_envpool_loop_replayed(
    env_id: str, num_envs: int, batch_size: int | None, make_kwargs: dict[str, Any], steps: int
) -> None:
    check_against_replay(env_id, num_envs, batch_size, make_kwargs, steps, direct=True)


@pytest.mark.parametrize(("batch_size"), [None, 4], ids=["sync", "send-recv"])
def test_envpools_public_api_path_gives_the_same_batches(
    batch_size: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task outside the direct path's layout (several players, a dict of observations) goes
    through EnvPool's public send / recv / reset; forced here on CartPole."""
    monkeypatch.setattr(StateLayout, "of", classmethod(lambda cls, handle: None))
    check_against_replay("CartPole-v1", 8, batch_size, {}, 60, direct=False)


def test_keys_and_flags_match_torchrl_multithreaded_env(monkeypatch: pytest.MonkeyPatch) -> None:
    torchrl_envs = pytest.importorskip("torchrl.envs")
    # TorchRL's wrapper imports treevalue (in the test extra).
    # TorchRL's wrapper reads EnvPool's spaces through its "gym" backend (the old `gym`
    # package, which does not install beside NumPy 2): Gymnasium's spaces, which EnvPool's
    # gymnasium tasks return, serve it under that name for this test.
    monkeypatch.setitem(sys.modules, "gym", gymnasium)
    theirs = torchrl_envs.MultiThreadedEnvWrapper(
        envpool.make("CartPole-v1", env_type="gymnasium", num_envs=4, seed=SEED)
    )
    ours = EnvPoolEnv("CartPole-v1", 4, seed=SEED)
    their_root = theirs.reset()
    our_root = ours.reset()
    torch.testing.assert_close(our_root[keys.OBSERVATION], their_root[keys.OBSERVATION])
    assert set(our_root.keys()) == set(their_root.keys())
    assert ours.action_spec.dtype == theirs.action_spec.dtype == torch.int64
    assert ours.action_spec.shape == theirs.action_spec.shape
    our_observation = ours.observation_spec[keys.OBSERVATION]
    their_observation = theirs.observation_spec[keys.OBSERVATION]
    assert (our_observation.shape, our_observation.dtype) == (
        their_observation.shape,
        their_observation.dtype,
    )
    assert set(ours.done_keys) == set(theirs.done_keys)
    generator = torch.Generator().manual_seed(0)
    for _ in range(40):
        action = torch.randint(0, 2, (4,), generator=generator)
        their_step = theirs.step(their_root.set(keys.ACTION, action))
        our_step = ours.step(our_root.set(keys.ACTION, action))
        assert set(our_step.keys(True, True)) == set(their_step.keys(True, True))
        for key in (keys.OBSERVATION, keys.REWARD, *keys.DONE_KEYS):
            torch.testing.assert_close(
                our_step[keys.NEXT, key].reshape(4, -1).float(),
                their_step[keys.NEXT, key].reshape(4, -1).float(),
            )
        if bool(our_step[keys.NEXT, keys.DONE].any()):
            break  # after an end TorchRL keeps EnvPool's reset-only step; we reset instead
        our_root = our_step[keys.NEXT].clone()
        their_root = their_step[keys.NEXT].clone()
    else:
        pytest.fail("no episode ended in 40 random CartPole steps")
    theirs.close()
    ours.close()


@pytest.mark.parametrize("batch_size", [None, 2], ids=["sync", "send-recv"])
def test_conformance_check_passes(batch_size: int | None) -> None:
    env = EnvPoolEnv("CartPole-v1", 4, batch_size=batch_size)
    check_env(env, steps=30)
    env.close()


def test_a_step_limit_transform_resets_the_envs_it_truncates() -> None:
    # The carrier's flags, set by the transform, decide which envs reset: not EnvPool's.
    env = TransformedEnv(EnvPoolEnv("CartPole-v1", 4, seed=SEED), StepCounter(max_steps=5))
    data = collect(env, steps=10, batches=1)
    truncated = data[keys.NEXT, keys.TRUNCATED].squeeze(-1)
    assert truncated[:, 4].all()
    assert (data[keys.STEP_COUNT].squeeze(-1)[:, 5] == 0).all()
    fresh = EnvPoolEnv("CartPole-v1", 4, seed=SEED)
    fresh.reset()
    second_start = fresh.reset()[keys.OBSERVATION]  # each env's second start state
    torch.testing.assert_close(data[keys.OBSERVATION][:, 5], second_start)
    fresh.close()


def test_set_seed_gives_env_i_seed_plus_i() -> None:
    env = EnvPoolEnv("CartPole-v1", 4, batch_size=2)
    assert env.set_seed(10) == 14
    first = env.reset()[keys.OBSERVATION]
    single = EnvPoolEnv("CartPole-v1", 2, seed=12)
    torch.testing.assert_close(first[2:], single.reset()[keys.OBSERVATION])
    env.set_seed(10)  # used pools are rebuilt: the same start states again
    torch.testing.assert_close(env.reset()[keys.OBSERVATION], first)
    env.close()
    single.close()


def test_seeding_unused_pools_with_their_seed_keeps_them() -> None:
    env = EnvPoolEnv("CartPole-v1", 2, seed=7)
    pools = list(env._pools)
    env.set_seed(7)
    assert env._pools == pools
    env.set_seed(8)
    assert env._pools != pools
    env.close()


def test_pong_frames_and_specs() -> None:
    env = EnvPoolEnv("Pong-v5", 2)
    spec = env.observation_spec[keys.OBSERVATION]
    assert (spec.shape, spec.dtype) == ((2, 4, 84, 84), torch.uint8)
    assert env.action_spec.dtype == torch.int64
    env.close()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_envs": 0}, r"num_envs must be a positive int; got num_envs=0"),
        ({"num_envs": 8, "batch_size": 3}, r"batch_size=3 does not divide num_envs=8"),
        ({"num_envs": 8, "batch_size": 0}, r"batch_size must be a positive int"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EnvPoolEnv("CartPole-v1", **kwargs)


def test_unknown_id_is_refused() -> None:
    with pytest.raises(ValueError, match=r"env_id='CartPole-v9' is not an EnvPool task id"):
        EnvPoolEnv("CartPole-v9", 2)


def test_missing_envpool_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "envpool", None)  # what `import envpool` sees uninstalled
    with pytest.raises(ImportError, match=r"pip install 'rlcollect\[envpool\]'"):
        EnvPoolEnv("CartPole-v1", 2)

"""Collector batches: frame counts per env batch, equality with env.rollout, batch-end options."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict.nn import TensorDictModule

from rlcollect import Collector
from rlcollect.envs.specs import Composite
from rlcollect.testing import CountingEnv, TensorDictCountingEnv


@pytest.mark.parametrize("env_batch", [(), (3,), (2, 2)])
def test_numel_is_steps_times_env_batch(env_batch: tuple[int, ...]) -> None:
    env = CountingEnv(episode_length=4, batch_size=env_batch)
    numel = math.prod(env_batch)
    collector = Collector(env, None, frames_per_batch=12, total_frames=36)
    steps = 12 // numel
    batches = list(collector)
    assert len(batches) == len(collector) == 3
    for batch in batches:
        assert batch.batch_size == torch.Size([*env_batch, steps])
        assert batch.names[-1] == "time"
        assert batch.numel() == steps * numel == 12
        assert batch["next", "observation"].shape == (*env_batch, steps, 1)


def parity_policy() -> TensorDictModule:
    """A deterministic action that depends on the observation (even count -> 0, odd -> 1)."""
    return TensorDictModule(
        lambda observation: observation.squeeze(-1).long() % 2,
        in_keys=["observation"],
        out_keys=["action"],
    )


@pytest.mark.parametrize("env_class", [CountingEnv, TensorDictCountingEnv])
def test_batched_collector_matches_env_rollout(env_class: type) -> None:
    lengths, steps, batches = [3, 5], 7, 4
    collector = Collector(
        env_class(episode_length=lengths, batch_size=(2,)),
        parity_policy(),
        frames_per_batch=2 * steps,
        total_frames=2 * steps * batches,
    )
    collected = torch.cat(list(collector), dim=-1)
    reference = env_class(episode_length=lengths, batch_size=(2,)).rollout(
        steps * batches, parity_policy(), break_when_any_done=False
    )
    for key in reference.keys(include_nested=True, leaves_only=True):
        assert torch.equal(collected[key], reference[key]), key
    # at a done step "next" holds the terminal observation; the following root is a reset one
    done = collected["next", "done"].squeeze(-1)
    terminal = collected["next", "observation"].squeeze(-1)[done]
    rows = done.nonzero()[:, 0]
    assert torch.equal(terminal, torch.tensor(lengths, dtype=torch.float32)[rows])
    after_done = torch.nn.functional.pad(done[:, :-1], (1, 0), value=False)
    assert (collected["observation"].squeeze(-1)[after_done] == 0).all()
    assert int(done.sum()) >= 8, "the run must cross several episode boundaries and batches"


def test_create_env_kwargs_reach_the_callable() -> None:
    collector = Collector(
        CountingEnv,
        None,
        frames_per_batch=6,
        total_frames=6,
        create_env_kwargs={"episode_length": 3},
    )
    done = collector.next()["next", "done"].flatten().tolist()
    assert done == [False, False, True, False, False, True]


def test_set_truncated_does_not_count_batch_cuts_as_episodes() -> None:
    collector = Collector(
        CountingEnv(episode_length=15),
        None,
        frames_per_batch=10,
        total_frames=30,
        set_truncated=True,
    )
    batches = list(collector)
    assert all(batch["next", "truncated"][-1].all() for batch in batches)
    stats = collector.stats()
    assert stats["episodes"] == 2, "only the env's own episode ends are episodes"
    assert stats["mean_episode_return"] == 15.0


def counting_env_without_truncated() -> CountingEnv:
    env = CountingEnv()
    env.done_spec = Composite({name: env.done_spec[name] for name in ("done", "terminated")})
    return env


def test_set_truncated_needs_a_truncated_flag() -> None:
    message = r"set_truncated=True marks steps truncated.* no 'truncated' flag .*add one"
    with pytest.raises(ValueError, match=message):
        Collector(counting_env_without_truncated(), None, frames_per_batch=10, set_truncated=True)


def test_max_frames_per_traj_adds_a_truncated_flag_to_an_env_without_one() -> None:
    collector = Collector(
        counting_env_without_truncated(), None, frames_per_batch=10, max_frames_per_traj=4
    )
    for start in (0, 10):  # written at every step, never left from a batch before
        batch = collector.next()
        truncated = batch["next", "truncated"].flatten().tolist()
        assert truncated == [step % 4 == 3 for step in range(start, start + 10)]
        assert batch["next", "done"].flatten().tolist() == truncated
        assert not batch["truncated"].any()


@pytest.mark.parametrize("argument", ["total_frames", "init_random_frames"])
def test_rounded_frame_counts_warn_naming_the_argument(argument: str) -> None:
    with pytest.warns(UserWarning, match=rf"{argument}=25 is not a multiple .* {argument}=30\."):
        collector = Collector(CountingEnv(), None, frames_per_batch=10, **{argument: 25})
    assert getattr(collector, argument) == 30

"""`PettingZooEnv` on real PettingZoo envs (mpe2's simple_spread / simple_adversary)."""

from __future__ import annotations

import functools

import pytest
import torch
from tensordict.nn import TensorDictModule

from rlcollect import Collector, MultiSyncCollector
from rlcollect.envs import ParallelEnv, SerialEnv
from rlcollect.envs.pettingzoo_env import PettingZooEnv
from rlcollect.testing import check_env
from tests.envs.spread_agents import greedy_agents, spread, spread_env

mpe2 = pytest.importorskip("mpe2")
from mpe2 import simple_adversary_v3  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_pettingzoo_env_passes_check_env() -> None:
    check_env(spread_env(max_cycles=5))


def test_layout_follows_torchrls_grouping() -> None:
    env = spread_env()
    assert env.group_map == {"agent": ["agent_0", "agent_1", "agent_2"]}
    assert env.action_keys == [("agent", "action")]
    assert env.reward_keys == [("agent", "reward")]
    assert env.done_keys == [
        "done",
        "terminated",
        "truncated",
        ("agent", "done"),
        ("agent", "terminated"),
        ("agent", "truncated"),
    ]
    data = env.rollout(4)
    assert data["agent"].batch_size == (4, 3)
    assert data["agent", "observation"].shape == (4, 3, 18)
    assert data["next", "agent", "reward"].shape == (4, 3, 1)
    env.close()


def test_rollouts_equal_pettingzoos_own_loop() -> None:
    collector = Collector(spread_env(seed=5), greedy_agents(), frames_per_batch=25, total_frames=25)
    batch = collector.next()
    collector.shutdown()
    assert bool(batch["next", "done"].any()), "an episode ended inside the batch"
    own = spread()
    own.reset(seed=5)  # what set_seed does, then the collector's own reset
    observations, _ = own.reset()
    agents = ["agent_0", "agent_1", "agent_2"]
    for t in range(25):
        expected = torch.stack([torch.as_tensor(observations[a]) for a in agents])
        assert torch.equal(batch["agent", "observation"][t], expected), t
        actions = {a: int(batch["agent", "action"][t, i]) for i, a in enumerate(agents)}
        observations, rewards, terminations, truncations, _ = own.step(actions)
        rewards_now = torch.tensor([[rewards[a]] for a in agents], dtype=torch.float32)
        assert torch.equal(batch["next", "agent", "reward"][t], rewards_now), t
        truncated = torch.tensor([[truncations[a]] for a in agents])
        assert torch.equal(batch["next", "agent", "truncated"][t], truncated), t
        if any(terminations.values()) or any(truncations.values()):
            assert bool(batch["next", "done"][t])
            observations, _ = own.reset()


def test_stepped_beneath_the_checking_wrappers_with_their_checks_kept() -> None:
    """PettingZoo's order-enforcing and out-of-bounds wrappers are skipped (their attribute
    forwarding is a third of an MPE step); the env given is untouched, out-of-space actions
    are still refused, and rollouts still equal PettingZoo's own loop (test above)."""
    from pettingzoo.utils.wrappers import OrderEnforcingWrapper

    given = spread()
    env = PettingZooEnv(given, seed=0)
    assert isinstance(given.aec_env, OrderEnforcingWrapper)  # not modified
    assert type(env.pettingzoo_env.aec_env).__name__ == "raw_env"
    env.reset()
    bad = TensorDictModule(
        lambda observation: torch.full(observation.shape[:-1], 7),
        in_keys=[("agent", "observation")],
        out_keys=[("agent", "action")],
    )
    with pytest.raises(ValueError, match=r"the action of 'agent_0' is 7, outside its action"):
        Collector(env, bad, frames_per_batch=4).next()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("batched", [SerialEnv, ParallelEnv])
def test_batched_pettingzoo_envs_have_a_tensordict_face(batched: type) -> None:
    """Batched grouped envs: actions and rewards stay under their groups in their spec."""
    env = batched(2, functools.partial(spread_env, max_cycles=5))
    check_env(env)
    rollout = env.rollout(7)  # stops at the first done, after max_cycles=5 steps
    assert rollout["agent", "action"].shape == (2, 5, 3)
    assert rollout["next", "agent", "reward"].shape == (2, 5, 3, 1)
    assert bool(rollout["next", "done"][:, -1].all())
    env.close()


def test_same_batches_as_torchrls_pettingzoo_wrapper() -> None:
    torchrl_envs = pytest.importorskip("torchrl.envs")
    torchrl_collectors = pytest.importorskip("torchrl.collectors")
    from tests.collectors.single.torchrl_parity import assert_same_batches

    batches = []
    for collector_class, env in (
        (Collector, PettingZooEnv(spread(), seed=0)),
        (torchrl_collectors.Collector, torchrl_envs.PettingZooWrapper(spread(), seed=0)),
    ):
        collector = collector_class(env, greedy_agents(), frames_per_batch=16, total_frames=48)
        batches.append(list(collector))
        collector.shutdown()
    assert sum(int(batch["next", "done"].sum()) for batch in batches[0]) >= 3
    assert_same_batches(*batches)


def test_default_groups_follow_torchrls_naming_rule() -> None:
    from rlcollect.envs.pettingzoo_env import group_by_name

    groups = group_by_name(["agent_0", "agent_1", "adversary_0", "prisoner", "red_team_x"])
    assert groups == {
        "agent": ["agent_0", "agent_1"],
        "adversary": ["adversary_0"],
        "prisoner": ["prisoner"],
        "red_team_x": ["red_team_x"],
    }


def test_group_maps() -> None:
    one_group = PettingZooEnv(spread(), group_map="all_in_one")
    assert one_group.action_keys == [("agents", "action")]
    per_agent = PettingZooEnv(spread(), group_map="per_agent")
    assert per_agent.action_keys == [(f"agent_{i}", "action") for i in range(3)]
    assert per_agent.rollout(2)["agent_1", "observation"].shape == (2, 1, 18)
    # simple_adversary's adversary sees less than the agents: grouped by name they stay apart.
    adversary = PettingZooEnv(simple_adversary_v3.parallel_env(N=2))
    assert adversary.group_map == {"adversary": ["adversary_0"], "agent": ["agent_0", "agent_1"]}
    check_env(PettingZooEnv(simple_adversary_v3.parallel_env(N=2, max_cycles=5), seed=1))
    with pytest.raises(ValueError, match=r"agents of group 'agents' must share their spaces"):
        PettingZooEnv(simple_adversary_v3.parallel_env(N=2), group_map="all_in_one")
    with pytest.raises(ValueError, match=r"must name every agent of the env once"):
        PettingZooEnv(spread(), group_map={"team": ["agent_0", "agent_1"]})
    with pytest.raises(ValueError, match=r"group_map must be None, 'all_in_one', 'per_agent'"):
        PettingZooEnv(spread(), group_map="teams")
    with pytest.raises(TypeError, match=r"env must be a PettingZoo ParallelEnv"):
        PettingZooEnv(object())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("batched", [SerialEnv, ParallelEnv])
def test_batched_pettingzoo_envs_in_a_collector(batched: type, no_leftover_children: None) -> None:
    env = batched(2, functools.partial(spread_env, max_cycles=6))
    collector = Collector(env, greedy_agents(), frames_per_batch=20, total_frames=40)
    batches = list(collector)
    collector.shutdown()
    ends = []
    for batch in batches:
        assert batch["agent", "observation"].shape == (2, 10, 3, 18)
        assert batch["agent"].batch_size == (2, 10, 3)
        ends.append(batch["next", "done"][0].flatten().nonzero().flatten().tolist())
    assert ends == [[5], [1, 7]]  # max_cycles=6 ends every episode after 6 steps


@pytest.mark.timeout(120)
def test_pettingzoo_envs_in_worker_processes(no_leftover_children: None) -> None:
    make = functools.partial(spread_env, max_cycles=6)
    collector = MultiSyncCollector([make, make], None, frames_per_batch=24, total_frames=48)
    batches = list(collector)
    collector.shutdown()
    assert [batch["agent", "action"].shape for batch in batches] == [(2, 12, 3)] * 2


@pytest.mark.timeout(120)
def test_count_steps_by_agent_steps(no_leftover_children: None) -> None:
    # Three agents act at every step: 300 agent steps are 100 env steps.
    single = Collector(
        spread_env(), None, frames_per_batch=300, total_frames=600, count_steps_by="agent_steps"
    )
    batches = list(single)
    assert [batch.batch_size for batch in batches] == [(100,), (100,)]
    assert single.stats()["frames"] == 600
    single.shutdown()
    batched = Collector(
        SerialEnv(2, spread_env),
        None,
        frames_per_batch=300,
        total_frames=300,
        count_steps_by="agent_steps",
    )
    assert batched.next().batch_size == (2, 50)
    batched.shutdown()
    workers = MultiSyncCollector(
        [spread_env, spread_env],
        None,
        frames_per_batch=300,
        total_frames=600,
        count_steps_by="agent_steps",
    )
    assert [batch.batch_size for batch in workers] == [(2, 50), (2, 50)]
    assert workers.frames == 600
    workers.shutdown()
    # A single-agent env counts the same either way (as RLlib does).
    gym = Collector("CartPole-v1", None, frames_per_batch=10, count_steps_by="agent_steps")
    assert gym.next().batch_size == (10,)
    gym.shutdown()
    with pytest.raises(ValueError, match=r"count_steps_by must be one of"):
        Collector("CartPole-v1", None, frames_per_batch=10, count_steps_by="agents")

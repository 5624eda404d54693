"""One policy per team (`policies=` + `policy_mapping_fn`) on real PettingZoo envs."""

from __future__ import annotations

import pytest
import torch

from rlcollect import Collector, MultiAsyncCollector, MultiSyncCollector, PolicyMap
from rlcollect.envs import SerialEnv
from rlcollect.envs.pettingzoo_env import PettingZooEnv
from tests.collectors.policy.tag_teams import Greedy, tag, team_of

mpe2 = pytest.importorskip("mpe2")
from mpe2 import simple_spread_v3, simple_tag_v3  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
PREDATORS = ["adversary_0", "adversary_1", "adversary_2"]


def spread(seed: int = 0) -> PettingZooEnv:
    env = simple_spread_v3.parallel_env(N=3, max_cycles=10, continuous_actions=False)
    return PettingZooEnv(env, group_map="all_in_one", seed=seed)


def first_or_rest(agent_id: str) -> str:
    return "first" if agent_id == "agent_0" else "rest"


def replay_in_pettingzoo(batch, env_fn, seed: int, agents_of: dict[str, list[str]]) -> None:
    """Step PettingZoo's own env with the batch's actions; each sub-batch's observations and
    rewards must be those of its agents, in the order `agents_of` names them."""
    own = env_fn()
    own.reset(seed=seed)
    observations, _ = own.reset()
    for t in range(batch.shape[0]):
        actions = {}
        for pid, agents in agents_of.items():
            for row, agent in enumerate(agents):
                expected = torch.as_tensor(observations[agent])
                assert torch.equal(batch[pid, "observation"][t, row], expected), (t, agent)
                actions[agent] = int(batch[pid, "action"][t, row])
        observations, rewards, terminations, truncations, _ = own.step(actions)
        for pid, agents in agents_of.items():
            for row, agent in enumerate(agents):
                assert float(batch["next", pid, "reward"][t, row]) == pytest.approx(rewards[agent])
        if any(terminations.values()) or any(truncations.values()):
            assert bool(batch["next", "done"][t])
            observations, _ = own.reset()


def test_two_teams_get_their_own_sub_batches_and_one_call_per_step() -> None:
    predator, prey = Greedy(16, seed=1), Greedy(14, seed=2)
    collector = Collector(
        tag(seed=3),
        policies={"predator": predator, "prey": prey},
        policy_mapping_fn=team_of,
        frames_per_batch=25,
    )
    calls_at_start = predator.calls, prey.calls  # the construction's probe call
    batch = collector.next()
    assert collector.policy.policy_agents == {"predator": PREDATORS, "prey": ["agent_0"]}
    assert predator.calls - calls_at_start[0] == 25  # one batched call per step
    assert prey.calls - calls_at_start[1] == 25
    collector.shutdown()
    assert set(batch.keys()) >= {"predator", "prey", "done", "collector"}
    assert "adversary" not in batch
    assert "agent" not in batch["next"]
    assert batch["predator"].batch_size == (25, 3)
    assert batch["prey"].batch_size == (25, 1)
    with torch.no_grad():
        assert torch.equal(
            batch["predator", "action"], predator.net(batch["predator", "observation"]).argmax(-1)
        )
        assert torch.equal(
            batch["prey", "action"], prey.net(batch["prey", "observation"]).argmax(-1)
        )
    replay_in_pettingzoo(
        batch,
        lambda: simple_tag_v3.parallel_env(max_cycles=10, continuous_actions=False),
        3,
        {"predator": PREDATORS, "prey": ["agent_0"]},
    )


def test_agents_of_one_group_split_between_policies() -> None:
    first, rest = Greedy(18, seed=1), Greedy(18, seed=2)
    collector = Collector(
        spread(seed=4),
        policies={"first": first, "rest": rest},
        policy_mapping_fn=first_or_rest,
        frames_per_batch=15,
    )
    batch = collector.next()
    collector.shutdown()
    assert batch["first"].batch_size == (15, 1)
    assert batch["rest"].batch_size == (15, 2)
    assert "agents" not in batch
    with torch.no_grad():
        assert torch.equal(
            batch["rest", "action"], rest.net(batch["rest", "observation"]).argmax(-1)
        )
    replay_in_pettingzoo(
        batch,
        lambda: simple_spread_v3.parallel_env(N=3, max_cycles=10, continuous_actions=False),
        4,
        {"first": ["agent_0"], "rest": ["agent_1", "agent_2"]},
    )


def test_batched_env_keeps_the_env_batch_dim() -> None:
    collector = Collector(
        SerialEnv(2, lambda: tag()),
        policies={"predator": Greedy(16, 1), "prey": Greedy(14, 2)},
        policy_mapping_fn=team_of,
        frames_per_batch=8,
    )
    batch = collector.next()
    collector.shutdown()
    assert batch["predator", "action"].shape == (2, 4, 3)
    assert batch["next", "prey", "reward"].shape == (2, 4, 1, 1)
    assert batch.names == [None, "time"]


def test_update_weights_by_policy_id_changes_only_that_policy() -> None:
    predator, prey = Greedy(16, 1), Greedy(14, 2)
    collector = Collector(
        tag(),
        policies={"predator": predator, "prey": prey},
        policy_mapping_fn=team_of,
        frames_per_batch=10,
    )
    new_prey = Greedy(14, seed=7)
    collector.update_policy_weights_(new_prey.state_dict(), policy_id="prey")
    batch = collector.next()
    assert torch.equal(prey.net.weight, new_prey.net.weight)
    with torch.no_grad():
        assert torch.equal(
            batch["prey", "action"], new_prey.net(batch["prey", "observation"]).argmax(-1)
        )
        assert torch.equal(
            batch["predator", "action"], predator.net(batch["predator", "observation"]).argmax(-1)
        )
    with pytest.raises(KeyError, match="policy_id='wolf' is not one of the policies"):
        collector.update_policy_weights_(new_prey.state_dict(), policy_id="wolf")
    collector.shutdown()


@pytest.mark.timeout(120)
def test_multi_sync_collector_updates_one_policy_in_its_workers() -> None:
    predator, prey = Greedy(16, 1), Greedy(14, 2)
    collector = MultiSyncCollector(
        [tag, tag],
        policies={"predator": predator, "prey": prey},
        policy_mapping_fn=team_of,
        frames_per_batch=20,
    )
    try:
        batch = collector.next()
        assert batch["predator", "action"].shape == (2, 10, 3)
        new_prey = Greedy(14, seed=7)
        collector.update_policy_weights_(new_prey, policy_id="prey")
        batch = collector.next()
        with torch.no_grad():
            prey_actions = new_prey.net(batch["prey", "observation"]).argmax(-1)
            predator_actions = predator.net(batch["predator", "observation"]).argmax(-1)
        assert torch.equal(batch["prey", "action"], prey_actions)
        assert torch.equal(batch["predator", "action"], predator_actions)
        assert torch.equal(prey.net.weight, Greedy(14, 2).net.weight)  # ours are untouched
    finally:
        collector.shutdown()


@pytest.mark.timeout(120)
def test_multi_async_collector_yields_sub_batches_per_policy() -> None:
    predator, prey = Greedy(16, 1), Greedy(14, 2)
    collector = MultiAsyncCollector(
        [tag, tag],
        policies={"predator": predator, "prey": prey},
        policy_mapping_fn=team_of,
        frames_per_batch=10,
        total_frames=40,
    )
    try:
        batches = list(collector)
    finally:
        collector.shutdown()
    assert len(batches) == 4
    for batch in batches:
        assert batch["predator", "action"].shape == (10, 3)
        with torch.no_grad():
            expected = prey.net(batch["prey", "observation"]).argmax(-1)
        assert torch.equal(batch["prey", "action"], expected)


def test_policies_equal_to_groups_keep_the_envs_layout() -> None:
    collector = Collector(
        tag(),
        policies={"adversary": Greedy(16, 1), "agent": Greedy(14, 2)},
        policy_mapping_fn=lambda agent_id: agent_id.split("_")[0],
        frames_per_batch=5,
    )
    assert not collector.policy.regroups
    batch = collector.next()
    collector.shutdown()
    assert batch["adversary", "action"].shape == (5, 3)


def test_bad_policy_maps_are_refused_at_construction() -> None:
    policies = {"predator": Greedy(16, 1), "prey": Greedy(14, 2)}
    with pytest.raises(ValueError, match="returned 'wolf', which is not a policy id"):
        Collector(tag(), policies=policies, policy_mapping_fn=lambda a: "wolf", frames_per_batch=4)
    with pytest.raises(ValueError, match=r"sends no agent to the policies \['prey'\]"):
        Collector(
            tag(), policies=policies, policy_mapping_fn=lambda a: "predator", frames_per_batch=4
        )
    with pytest.raises(TypeError, match="policy_mapping_fn is needed"):
        Collector(tag(), policies=policies, frames_per_batch=4)
    with pytest.raises(TypeError, match="not both"):
        Collector(
            tag(), Greedy(16, 1), policies=policies, policy_mapping_fn=team_of, frames_per_batch=4
        )
    with pytest.raises(TypeError, match="pass policies too"):
        Collector(tag(), policy_mapping_fn=team_of, frames_per_batch=4)
    with pytest.raises(ValueError, match="has no agent groups"):
        Collector("CartPole-v1", policies={"a": Greedy(4, 1)}, frames_per_batch=4)
    with pytest.raises(ValueError, match="cannot name a sub-batch"):
        PolicyMap({"next": Greedy(16, 1)})
    mixed = {"all": Greedy(16, 1)}
    with pytest.raises(ValueError, match="whose entries differ"):
        Collector(tag(), policies=mixed, frames_per_batch=4)


def test_policy_id_on_a_single_policy_collector_is_refused() -> None:
    single = Collector(tag(), policy=None, frames_per_batch=4)
    with pytest.raises(RuntimeError, match="random actions"):
        single.update_policy_weights_(Greedy(14, 1), policy_id="prey")
    single.shutdown()
    from tensordict.nn import TensorDictModule

    over_group = TensorDictModule(
        Greedy(18, 1), in_keys=[("agents", "observation")], out_keys=[("agents", "action")]
    )
    one = Collector(spread(), over_group, frames_per_batch=4)
    with pytest.raises(ValueError, match="this collector runs one policy"):
        one.update_policy_weights_(Greedy(18, 2), policy_id="prey")
    one.shutdown()

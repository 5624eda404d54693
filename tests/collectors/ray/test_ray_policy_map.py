"""RayCollector with one policy per team: sub-batches per policy id, updates by policy id."""

from __future__ import annotations

import pytest
import torch

from rlcollect.collectors.ray.collector import RayCollector
from tests.collectors.policy.tag_teams import Greedy, tag, team_of
from tests.collectors.ray.helpers import RAY_TEST_TIMEOUT

pytest.importorskip("ray")
pytest.importorskip("mpe2")

pytestmark = [
    pytest.mark.timeout(RAY_TEST_TIMEOUT),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def greedy_actions(policy: Greedy, observation: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return policy.net(observation).argmax(-1)


def test_actors_run_a_policy_per_team_and_take_updates_by_id() -> None:
    predator, prey = Greedy(16, 1), Greedy(14, 2)
    with RayCollector(
        tag,
        num_collectors=2,
        policies={"predator": predator, "prey": prey},
        policy_mapping_fn=team_of,
        frames_per_batch=20,
    ) as collector:
        batch = collector.next()
        assert batch["predator", "action"].shape == (2, 10, 3)
        assert batch["next", "prey", "reward"].shape == (2, 10, 1, 1)
        new_prey = Greedy(14, seed=7)
        collector.update_policy_weights_(new_prey, policy_id="prey")
        batch = collector.next()
    expected_prey = greedy_actions(new_prey, batch["prey", "observation"])
    assert torch.equal(batch["prey", "action"], expected_prey)
    expected_predator = greedy_actions(predator, batch["predator", "observation"])
    assert torch.equal(batch["predator", "action"], expected_predator)
    assert (batch["collector", "traj_ids"][0, 0] != batch["collector", "traj_ids"][1, 0]).all()

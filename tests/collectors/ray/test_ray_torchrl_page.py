"""TorchRL's front door with backend="ray", and the methods of TorchRL's Collector page on a
`RayCollector` (one collector of two actors for the whole file: actors are slow to start)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from rlcollect.collectors import Collector, RayCollector
from tests.collectors.ray.helpers import RAY_TEST_TIMEOUT, counting_env

ray = pytest.importorskip("ray")

pytestmark = [
    pytest.mark.timeout(RAY_TEST_TIMEOUT),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]


class FirstAction(nn.Module):
    """Always action 0 of the counting env's two, with a layer whose weights travel."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.zeros(observation.shape[:-1], dtype=torch.int64)


def make_policy() -> TensorDictModule:
    return TensorDictModule(FirstAction(), in_keys=["observation"], out_keys=["action"])


@pytest.fixture
def policy() -> TensorDictModule:
    return make_policy()


@pytest.fixture
def collector(policy: TensorDictModule) -> Iterator[Any]:
    built = Collector(
        counting_env(4),
        policy,
        frames_per_batch=8,
        backend="ray",
        num_collectors=2,
        sync=True,
        backend_options={"worker_timeout": 60.0},
    )
    yield built
    built.shutdown(timeout=10.0, raise_on_error=False)


def test_the_front_door_builds_a_ray_collector_and_the_page_methods_answer(
    collector: Any, policy: TensorDictModule
) -> None:
    # --- the front door: TorchRL's Collector(backend="ray") is its RayCollector ---
    assert type(collector) is RayCollector
    assert collector.sync
    assert collector.num_collectors == 2
    assert next(collector.iterator()).batch_size == (2, 4)
    assert collector.rollout().batch_size == (2, 4)
    # --- versions, models, weights ---
    assert collector.get_model("policy") is policy
    assert collector.getattr_policy("out_keys") == ["action"]
    trained = make_policy()
    collector.update_policy_weights_(weights_dict={"policy": TensorDict.from_module(trained)})
    assert collector.get_policy_version() == 1
    collector.increment_version()
    collector.receive_weights(trained)
    assert collector.policy_version == 3
    # --- the first actor's env (TorchRL's getattr_env reads its first worker's) ---
    assert collector.getattr_env("episode_length") == 4
    with pytest.raises(AttributeError, match="no_such_attribute"):
        collector.getattr_env("no_such_attribute")
    # --- seeds, resets, state ---
    assert collector.set_seed(11, static_seed=True) == 11
    assert collector.set_seed(11) == 13
    collector.reset(index=1)
    collector.reset(index=[True, False])
    collector.load_state_dict(state_dict=collector.state_dict())
    assert (collector.next()["observation"][:, 0] == 0).all()


def test_the_ray_backend_defaults_to_sync_false_as_torchrl() -> None:
    with Collector(
        counting_env(4), frames_per_batch=4, total_frames=8, backend="ray", num_collectors=2
    ) as collector:
        assert type(collector) is RayCollector
        assert collector.sync is False
        batches = list(collector)
    assert len(batches) == 2
    # TorchRL's keys: the actor's index is only there with track_worker_id=True
    assert all(("collector", "worker_id") not in batch.keys(True) for batch in batches)

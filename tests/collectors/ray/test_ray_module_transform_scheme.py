"""A `Collector` sends a model's weights through the scheme registered under its model id.

TorchRL's `RayModuleTransform` runs its module in a Ray actor; its `RayModuleTransformScheme`,
given to the collector as `weight_sync_schemes={"transform_module": scheme}`, carries that
module's weights there (torch.distributed between this process and the actor).
`update_policy_weights_(weights, model_id="transform_module")` sends through it, so the next
batch is transformed by the new weights, on our `Collector` as on TorchRL's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

import rlcollect.collectors
from tests.collectors.ray.helpers import RAY_TEST_TIMEOUT

ray = pytest.importorskip("ray")
torchrl_collectors = pytest.importorskip("torchrl.collectors")
dist = pytest.importorskip("torch.distributed")

pytestmark = [
    pytest.mark.timeout(RAY_TEST_TIMEOUT),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]


@pytest.fixture
def no_process_group_left() -> Iterator[None]:
    """The scheme starts a process group in this process (rank 0); none outlives the test."""
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def mean_observations_before_and_after_update(collector_class: type) -> tuple[float, float]:
    """The mean observation of a batch before and of one after the transform's bias (added
    to every observation, in its actor) goes from 0 to 100 through the scheme."""
    from torchrl.envs import TransformedEnv
    from torchrl.envs.transforms.module import RayModuleTransform
    from torchrl.modules import RandomPolicy
    from torchrl.testing.mocking_classes import ContinuousActionVecMockEnv
    from torchrl.testing.modules import BiasModule
    from torchrl.weight_update import RayModuleTransformScheme

    module = TensorDictModule(BiasModule(), in_keys=["observation"], out_keys=["observation"])
    scheme = RayModuleTransformScheme()
    transform = RayModuleTransform(module=module, weight_sync_scheme=scheme)

    def make_env() -> Any:
        return TransformedEnv(ContinuousActionVecMockEnv(), transform)

    collector = collector_class(
        make_env,
        RandomPolicy(ContinuousActionVecMockEnv().action_spec),
        frames_per_batch=50,
        total_frames=100,
        weight_sync_schemes={"transform_module": scheme},
    )
    try:
        before = collector.next()["observation"].mean().item()
        weights = TensorDict.from_module(module)
        weights["module", "bias"].data.fill_(100.0)
        collector.update_policy_weights_(weights, model_id="transform_module")
        after = collector.next()["observation"].mean().item()
    finally:
        collector.shutdown()  # closes the env, and the transform with it
        ray.kill(transform._actor)  # the session cluster's CPUs are for the next tests
    return before, after


@pytest.mark.usefixtures("no_process_group_left")
@pytest.mark.parametrize("owner", ["rlcollect", "torchrl"])
def test_update_with_a_model_id_sends_through_its_scheme(owner: str) -> None:
    library = rlcollect.collectors if owner == "rlcollect" else torchrl_collectors
    before, after = mean_observations_before_and_after_update(library.Collector)
    assert after > before + 50

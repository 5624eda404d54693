"""An exploration module built with `spec=None` gets the env's action spec from the collector
before the policy's first call, as TorchRL's collectors lend it: here for the collector class
that TorchRL's Hydra configs do not build (the others: test_hydra_configs.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("torchrl.modules")

from tensordict.nn import TensorDictModule, TensorDictSequential
from torchrl.envs.libs.gym import GymEnv
from torchrl.modules import MLP, AdditiveGaussianModule, TanhModule

from rlcollect import AsyncBatchedCollector

pytestmark = pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")


def pendulum() -> GymEnv:
    return GymEnv("Pendulum-v1")


@pytest.mark.timeout(240)
def test_async_batched_collector_lends_the_spec_before_its_probe() -> None:
    spec = pendulum().action_spec
    network = TensorDictModule(
        MLP(in_features=3, out_features=1, num_cells=[8]), ["observation"], ["param"]
    )
    actor = TensorDictSequential(
        network, TanhModule(in_keys=["param"], out_keys=["action"], spec=spec)
    )
    noise = AdditiveGaussianModule(spec=None, sigma_init=5.0, sigma_end=5.0)
    collector = AsyncBatchedCollector(
        [pendulum, pendulum],
        policy=TensorDictSequential(actor, noise),
        frames_per_batch=20,
        total_frames=40,
    )
    try:
        batches = list(collector)
    finally:
        collector.shutdown()
    assert noise.spec is not None  # the user's module got it, as TorchRL's collector does
    actions = [batch["action"] for batch in batches]
    assert sum(action.numel() for action in actions) == 40
    # a noise of sigma 5 clamped to the lent spec: Pendulum's [-2, 2]
    assert all(((action >= -2.0) & (action <= 2.0)).all() for action in actions)

"""TorchRL's config-system trainers, composed from TorchRL's own Hydra config groups (what its
`sota-implementations/*_trainer` scripts compose, tiny), run end to end on our collectors and,
side by side, on TorchRL's: the trainer refuses no collector of ours, trains, sends its
weights to the collector after each batch and shuts the collector (and its workers) down."""

from __future__ import annotations

import gc

import pytest
import torch
from tensordict import TensorDict

pytest.importorskip("torchrl.trainers")
hydra = pytest.importorskip("hydra")

from tests.hydra_store import import_torchrl_configs, torchrl_config_store  # noqa: E402, F401

import_torchrl_configs()  # Hydra's store kept as our examples expect (tests/hydra_store.py)

from hydra.utils import instantiate  # noqa: E402
from torchrl.collectors import BaseCollector  # noqa: E402

import rlcollect  # noqa: E402
from tests.torchrl_frontends.trainer_configs import BATCHES, FRAMES, compose_trainer  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures(
        "no_leftover_children", "nothing_left_at_os_level", "torchrl_config_store"
    ),
    pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning"),
]

OURS = {
    "sync": rlcollect.Collector,
    "multi_sync": rlcollect.MultiSyncCollector,
    "multi_async": rlcollect.MultiAsyncCollector,
}


def parameters(module: torch.nn.Module) -> TensorDict:
    return TensorDict.from_module(module).detach().clone()


CASES = [
    ("dqn", "sync"),
    ("dqn", "multi_sync"),
    ("ppo", "multi_async"),
    ("ppo", "multi_sync"),
    ("ppo", "sync"),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("implementation", ["rlcollect", "torchrl"])
@pytest.mark.parametrize(("name", "collector"), CASES)
def test_config_trainer_trains_on_the_collector(
    name: str, collector: str, implementation: str
) -> None:
    if implementation == "torchrl" and name == "ppo" and collector != "sync":
        pytest.skip(
            "TorchRL 0.14.1's PPO trainer refuses its own multi-process collectors unless a "
            "weight_update_map is given (they carry weight-sync schemes by default)."
        )
    torch.manual_seed(0)
    cfg = compose_trainer(name, collector, implementation)
    trainer = instantiate(cfg.trainer)
    collector_object = trainer.collector
    if implementation == "rlcollect":
        assert type(collector_object) is OURS[collector]
    assert isinstance(collector_object, BaseCollector)
    trained = (
        trainer.loss_module.actor_network if name == "ppo" else trainer.loss_module.value_network
    )
    before = parameters(trained)
    versions: list[int] = []
    trainer.register_op("batch_process", lambda batch: versions.append(batch.numel()))
    try:
        # TorchRL's trainer checkpoints the collector with its own state (and restores it)
        state = trainer.state_dict()
        assert "collector" in state
        trainer.load_state_dict(state)
        trainer.train()
    finally:
        collector_object.shutdown()
    # --- what the run shows ---------------------------------------------------------------------
    assert trainer.collected_frames == BATCHES * FRAMES
    assert versions == [FRAMES] * BATCHES
    after = parameters(trained)
    assert not (after == before).all(), "the trainer changed no weight"
    if implementation == "rlcollect":
        # the trainer's UpdateWeights hook ran after every batch
        assert collector_object.policy_version >= BATCHES - 1
        # TorchRL's meaning: the random frames asked for, 0 when none (the trainer compares)
        assert collector_object.init_random_frames == (cfg.collector.init_random_frames or 0)
    # Dropped here, not when pytest lets go of this frame: the workers' shared buffers are
    # unmapped with the collector, before the fixtures count what is still mapped.
    del trainer, collector_object
    gc.collect()

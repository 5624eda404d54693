"""TorchRL's PPO trainer composed from TorchRL's config groups as `sota-implementations/
ppo_trainer` composes them (tiny: tests/torchrl_frontends/trainer_configs.py's PPO config),
with TorchRL's own `_target_: torchrl.collectors.MultiSyncCollector`, trained to the end.
Tests run it under `python -m rlcollect.patch`; it prints what the trainer was given and did.
"""

from __future__ import annotations

import json

import torch
from hydra.utils import instantiate

from tests import hydra_store
from tests.torchrl_frontends import trainer_configs

# TorchRL's config classes, imported at the top as TorchRL's trainer scripts import them (so
# also in the workers, which import this module again: TorchRL's collectors are imported, and
# patched, there too).
hydra_store.import_torchrl_configs()


def main() -> None:
    # TorchRL's config groups back in Hydra's store (imported above, kept aside)
    assert hydra_store._torchrl_entries is not None
    for path, node in hydra_store._torchrl_entries.items():
        hydra_store._put(path, node)
    torch.manual_seed(0)
    cfg = trainer_configs.compose_trainer("ppo", "multi_sync", "torchrl")
    trainer = instantiate(cfg.trainer)
    collector = trainer.collector
    try:
        trainer.train()
    finally:
        collector.shutdown()
    built = type(collector)
    report = {
        "target": cfg.collector._target_,
        "collector": f"{built.__module__}.{built.__qualname__}",
        "collected_frames": trainer.collected_frames,
        "expected_frames": trainer_configs.BATCHES * trainer_configs.FRAMES,
    }
    print(json.dumps(report))  # noqa: T201


if __name__ == "__main__":
    main()

"""BenchMARL 1.5.2's own GRU or LSTM policy (MAPPO, VMAS balance) collected by our `Collector`
and by TorchRL's, same seed, same weights; exits 0 when the batches agree.

Run in a process of its own (test_lazy_policies.py does): BenchMARL imports the name
`SyncDataCollector`, which TorchRL 0.14.1 removed, so it is pointed at TorchRL's `Collector`
here, for this process only.

    python tests/collectors/policy/benchmarl_recurrent_side_by_side.py gru
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import torchrl.collectors
from tensordict import TensorDictBase

import rlcollect

FRAMES_PER_BATCH = 80
TOTAL_FRAMES = 160


def experiment(kind: str) -> object:
    """A BenchMARL experiment whose policy and critic are BenchMARL's `kind` model."""
    torchrl.collectors.SyncDataCollector = torchrl.collectors.Collector  # type: ignore[attr-defined]
    from benchmarl.algorithms import MappoConfig
    from benchmarl.environments import VmasTask
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models import GruConfig, LstmConfig

    config = ExperimentConfig.get_from_yaml()
    config.sampling_device = config.train_device = "cpu"
    config.on_policy_collected_frames_per_batch = FRAMES_PER_BATCH
    config.on_policy_n_envs_per_worker = 4
    config.max_n_frames = TOTAL_FRAMES
    config.evaluation = config.render = config.create_json = False
    config.loggers = []
    config.checkpoint_interval = 0
    config.checkpoint_at_end = False
    task = VmasTask.BALANCE.get_from_yaml()
    task.config["max_steps"] = 10
    model = (GruConfig if kind == "gru" else LstmConfig).get_from_yaml()
    return Experiment(
        task=task,
        algorithm_config=MappoConfig.get_from_yaml(),
        model_config=model,
        critic_model_config=model,
        seed=0,
        config=config,
    )


def collect(collector_class: type, env_func: Callable[[], object], policy: object) -> list:
    torch.manual_seed(0)
    env = env_func()
    env.set_seed(0)  # type: ignore[attr-defined]
    collector = collector_class(
        env, policy, frames_per_batch=FRAMES_PER_BATCH, total_frames=TOTAL_FRAMES, device="cpu"
    )
    try:
        return list(collector)
    finally:
        collector.shutdown()


def compare(mine: list[TensorDictBase], reference: list[TensorDictBase]) -> None:
    """Every key of TorchRL's batches equal in ours (TorchRL leaves out the outputs of a
    policy holding meta tensors that are no action, e.g. the log-probabilities; ours keeps
    them)."""
    assert len(mine) == len(reference) == TOTAL_FRAMES // FRAMES_PER_BATCH
    for index, (batch, expected) in enumerate(zip(mine, reference, strict=True)):
        assert batch.batch_size == expected.batch_size, index
        for key in expected.keys(include_nested=True, leaves_only=True):
            assert torch.equal(batch[key], expected[key]), (index, key)
        assert ("agents", "action") in expected.keys(include_nested=True)
        assert ("agents", "log_prob") in batch.keys(include_nested=True)
        assert bool(batch["next", "done"].any()), "no episode ended"


def main(kind: str) -> None:
    built = experiment(kind)
    policy = built.policy  # type: ignore[attr-defined]
    held = [p for p in policy.parameters() if p.is_meta]
    assert held, "BenchMARL's model no longer holds meta tensors: nothing tested"
    mine = collect(rlcollect.Collector, built.env_func, policy)  # type: ignore[attr-defined]
    reference = collect(torchrl.collectors.Collector, built.env_func, policy)  # type: ignore[attr-defined]
    compare(mine, reference)
    sys.stdout.write(
        f"same batches: {len(mine)} of {mine[0].batch_size}, {len(held)} meta tensors\n"
    )


if __name__ == "__main__":
    main(sys.argv[1])

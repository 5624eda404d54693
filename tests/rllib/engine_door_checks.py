"""What the engine-door tests share: an RLlib Algorithm trained once through a runner class,
with the engine's `RolloutLoop.collect` calls counted in this process, and what each runner
says samples in it."""

from __future__ import annotations

from typing import Any

import pytest
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

from rlcollect.collectors.rollout import RolloutLoop


def engine_facts(runner: Any) -> dict:
    """What samples in `runner`: the sampler, the engine env and loop, the batches collected."""
    sampler = runner._sampler
    loop = sampler._current
    return {
        "sampler": type(sampler).__name__,
        "env": type(sampler.env).__name__,
        "loop": f"{type(loop).__module__}.{type(loop).__name__}",
        "batches": sampler.batches,
        "carrier_keys": sorted(map(str, loop.layout.carrier.keys())),
    }


def train_once_counting_loops(
    config: AlgorithmConfig,
    runner_cls: type,
    num_env_runners: int,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[dict], list[RolloutLoop]]:
    """Train `config` one iteration with `runner_cls` (2 envs a runner, local when
    `num_env_runners` is 0): `(engine_facts of each runner, the loops whose collect() ran in
    this process, once per call)`."""
    collected: list[RolloutLoop] = []
    original = RolloutLoop.collect

    def counting_collect(self, *args, **kwargs):
        collected.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(RolloutLoop, "collect", counting_collect)
    algo = (
        config.env_runners(
            env_runner_cls=runner_cls,
            num_env_runners=num_env_runners,
            num_envs_per_env_runner=2,
        )
        .training(train_batch_size_per_learner=200, minibatch_size=100, num_epochs=1)
        .build_algo()
    )
    try:
        algo.train()
        facts = algo.env_runner_group.foreach_env_runner(
            engine_facts, local_env_runner=num_env_runners == 0
        )
    finally:
        algo.stop()
    return facts, collected

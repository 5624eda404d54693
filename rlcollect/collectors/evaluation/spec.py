"""`EvaluationWorkerSpec`: what an evaluation worker builds its runner from, on either backend.

A worker process (`worker.py`, the "process" backend) and a Ray actor (`ray_actor.py`) build
the same runner from the same spec, so it lives here, apart from the process machinery: the
Ray side imports nothing of worker processes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlcollect.collectors.evaluation.runner import EpisodeRunner
from rlcollect.collectors.evaluation.settings import EvaluationSettings
from rlcollect.collectors.weights.schemes import WeightSyncScheme


@dataclass
class EvaluationWorkerSpec:
    """What the worker builds its runner from. To a worker process it travels as a
    `WorkerPayload` (cloudpickle, so lambdas work; multiprocessing's shared objects in the env
    factory are shared), to a Ray actor as Ray pickles it."""

    env_factory: Callable[[], Any]
    policy_factory: Callable[..., Any]
    settings: EvaluationSettings
    scheme: WeightSyncScheme
    init_fn: Callable[[], None] | None = None
    # TorchRL calls the policy factory with no argument in a worker process, with the env in
    # a Ray actor (see `build_policy`).
    factory_takes_env: bool = False

    def build(self) -> EpisodeRunner:
        if self.init_fn is not None:
            self.init_fn()
        return EpisodeRunner.build(
            self.env_factory,
            None,
            self.policy_factory,
            self.settings,
            factory_takes_env=self.factory_takes_env,
        )

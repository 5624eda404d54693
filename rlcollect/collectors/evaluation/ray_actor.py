"""The "ray" backend: evaluations run in one Ray actor, on one machine or a cluster.

Ray is imported when the first evaluation creates the actor, so the package imports without
the ray extra. The evaluator holds a `RayLease` while the actor lives (Ray is started for the
user when they have not, and stopped with the last lease, as for `RayCollector`). Weights are
checked here against the layout the actor reports and travel through Ray's object store; an
actor that raises or dies is reported as an `ActorError` with the actor's traceback, and the
next evaluation creates a fresh actor.
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch

from rlcollect.collectors.evaluation.runner import EvaluationCancelledError
from rlcollect.collectors.evaluation.spec import EvaluationWorkerSpec
from rlcollect.collectors.policy.weights import (
    Weights,
    WeightsLayout,
    flat_weights,
    layout_template,
    state_layout,
    validated_weights,
)
from rlcollect.collectors.ray.fleet import ActorError, remote_traceback
from rlcollect.collectors.weights.schemes import POLICY_MODEL_ID, NoWeightSyncScheme
from rlcollect.runtime.ray_lease import RayLease, require_ray

# Seconds between two checks of `stop` while an evaluation runs in the actor.
STOP_POLL = 0.2


class EvaluationActor:
    """Builds the env and the policy in the actor (after `init_fn`) and runs evaluations."""

    def __init__(self, spec: EvaluationWorkerSpec) -> None:
        # Ray hands tensors over read-only from its object store: own copies instead.
        self.runner = copy.deepcopy(spec).build()

    def layout(self) -> WeightsLayout:
        """The names, shapes and dtypes of the policy's weights."""
        return state_layout(self.runner.policy_state())

    def evaluate(self, weights: dict[str, Weights] | None, step: int) -> dict[str, Any]:
        return self.runner.run(weights, step)

    def policy_state(self) -> dict[str, torch.Tensor]:
        return self.runner.policy_state()

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self.runner.close()


class RayBackend:
    """Runs an `EpisodeRunner` in one Ray actor.

    Args:
        env_factory: builds the env in the actor.
        policy_factory: builds the policy in the actor, from the env.
        settings: the evaluation's settings.

    Keyword Args:
        init_fn: called in the actor before the env and the policy are built.
        num_gpus: GPUs the actor asks Ray for (TorchRL's default, 1; 0 on a CPU machine).
        ray_kwargs: other `ray.remote` options of the actor (`num_cpus`, `resources`, ...).
    """

    def __init__(
        self,
        env_factory: Callable[[], Any],
        policy_factory: Callable[..., Any],
        settings: Any,
        *,
        init_fn: Callable[[], None] | None = None,
        num_gpus: float = 1,
        ray_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(num_gpus, int | float) or isinstance(num_gpus, bool) or num_gpus < 0:
            raise ValueError(f"num_gpus must be a number >= 0; got {num_gpus!r}.")
        self._spec = EvaluationWorkerSpec(
            env_factory,
            policy_factory,
            settings,
            NoWeightSyncScheme(),
            init_fn,
            factory_takes_env=True,
        )
        self._options = {"num_gpus": num_gpus, **dict(ray_kwargs or {})}
        self._lock = threading.Lock()
        self._closed = False
        self._lease: RayLease | None = None
        self._actor: Any = None
        self.template: Weights | None = None

    def run(
        self, weights: Mapping[str, Any] | None, step: int, stop: Callable[[], bool]
    ) -> dict[str, Any]:
        """One evaluation in the actor, waited for while `stop` answers False.

        Raises:
            ActorError: the actor raised (its traceback in the message) or died.
            EvaluationCancelledError: `stop` answered True (the actor is then killed).
        """
        with self._lock:
            actor = self._started()
            ref = actor.evaluate.remote(self._checked(weights or {}), step)
            return self._wait(ref, "evaluate", stop)  # type: ignore[no-any-return]

    def policy_state(self) -> dict[str, torch.Tensor]:
        """The state dict of the policy the actor runs."""
        with self._lock:
            return self._wait(self._started().policy_state.remote(), "policy_state")  # type: ignore[no-any-return]

    @property
    def pid(self) -> int | None:
        """The actor's process id (None before the first evaluation creates it)."""
        with self._lock:
            if self._actor is None:
                return None
            return self._wait(self._actor.pid.remote(), "pid")  # type: ignore[no-any-return]

    def _started(self) -> Any:
        if self._closed:
            raise RuntimeError("the evaluator was shut down; build a new Evaluator.")
        if self._actor is not None:
            return self._actor
        ray = require_ray("Evaluator(backend='ray')")
        self._lease = self._lease or RayLease.acquire()
        gpus = ray.cluster_resources().get("GPU", 0)
        if self._options["num_gpus"] > gpus:
            raise ValueError(
                f"num_gpus={self._options['num_gpus']} asks Ray for GPUs the cluster does not "
                f"have ({gpus:g}); pass num_gpus=0 to evaluate on CPUs."
            )
        remote = ray.remote(**self._options)(EvaluationActor)
        self._actor = remote.remote(self._spec)
        layout = self._wait(self._actor.layout.remote(), "building the env and policy")
        self.template = layout_template(layout)
        return self._actor

    def _checked(self, weights: Mapping[str, Any]) -> dict[str, Weights]:
        """Every model's weights as detached CPU tensors, the policy's checked first."""
        checked = {
            model_id: {name: t.detach().cpu() for name, t in flat_weights(source).items()}
            for model_id, source in weights.items()
            if model_id != POLICY_MODEL_ID
        }
        if POLICY_MODEL_ID in weights:
            if not self.template:
                raise TypeError(
                    "weights were given, but the evaluation policy the actor built has none "
                    "to load: loading weights requires an nn.Module policy with parameters or "
                    "buffers. Leave weights out, or have policy_factory build a module."
                )
            policy = validated_weights(weights[POLICY_MODEL_ID], self.template)
            checked[POLICY_MODEL_ID] = {name: t.cpu() for name, t in policy.items()}
        return checked

    def _wait(self, ref: Any, what: str, stop: Callable[[], bool] = lambda: False) -> Any:
        ray = require_ray("Evaluator(backend='ray')")
        while not ray.wait([ref], timeout=STOP_POLL)[0]:
            if stop() or self._closed:
                self._kill()
                raise EvaluationCancelledError
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as err:
            cause = err.cause
            reason = f"{what} raised {type(cause).__name__}: {cause}"
            raise ActorError(0, reason, remote_traceback(err)) from cause
        except ray.exceptions.RayActorError as err:
            self._kill()
            reason = f"the evaluation actor died during {what} ({type(err).__name__})"
            raise ActorError(0, reason, remote_traceback(err)) from err

    def _kill(self) -> None:
        actor, self._actor = self._actor, None
        if actor is not None:
            ray = require_ray("Evaluator(backend='ray')")
            with contextlib.suppress(Exception):
                ray.kill(actor)

    def cancel(self) -> None:
        """Have the evaluation in flight given up (its actor is killed)."""
        self._closed = True

    def close(self, timeout: float) -> None:
        """Let the actor close its env, kill it, and release Ray. Idempotent."""
        self._closed = True
        acquired = self._lock.acquire(timeout=max(timeout, 0.0))
        try:
            actor = self._actor
            if actor is not None:
                ray = require_ray("Evaluator(backend='ray')")
                with contextlib.suppress(Exception):
                    ray.get(actor.close.remote(), timeout=max(timeout, 0.1))
                self._kill()
            if self._lease is not None:
                self._lease.release()
                self._lease = None
        finally:
            if acquired:
                self._lock.release()

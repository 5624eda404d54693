"""Where an `Evaluator`'s evaluations run: the backends' contract, and the one its arguments
choose, checked against that backend's needs (the "process" and "ray" backends build the env and
the policy where they run, so they need factories)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from rlcollect.collectors.evaluation.local import LocalBackend
from rlcollect.collectors.evaluation.process import ProcessBackend
from rlcollect.collectors.evaluation.ray_actor import RayBackend
from rlcollect.collectors.evaluation.settings import EvaluationSettings, is_env

BACKENDS = ("thread", "process", "ray")


class EvaluationBackend(Protocol):
    """Where evaluations run; one at a time, in the thread that calls `run`."""

    def run(
        self, weights: Mapping[str, Any] | None, step: int, stop: Callable[[], bool]
    ) -> dict[str, Any]:
        """Load `weights`, play the episodes, return raw metrics (see `metrics.py`)."""
        ...

    def cancel(self) -> None:
        """Make the evaluation in flight, if any, end soon (at shutdown)."""
        ...

    def close(self, timeout: float) -> None:
        """Release everything: env, worker process or actor."""
        ...


def check_choice(argument: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"Unknown {argument} {value!r}; choose one of {list(choices)}.")


def check_policy_arguments(policy: Any, policy_factory: Any) -> None:
    if policy is not None and policy_factory is not None:
        raise ValueError("Provide either `policy` or `policy_factory`, not both.")
    if policy is None and policy_factory is None:
        raise ValueError(
            "A policy or a policy_factory must be provided: pass the evaluation policy, or "
            "policy_factory=lambda env: make_policy(env)."
        )
    if policy_factory is not None and not callable(policy_factory):
        raise TypeError(
            f"policy_factory must be a callable (env) -> policy; got {policy_factory!r}."
        )


def check_collector_cls(collector_cls: Any) -> None:
    name = (
        collector_cls
        if isinstance(collector_cls, str)
        else getattr(collector_cls, "__name__", None)
    )
    if collector_cls is not None and name != "Collector":
        raise ValueError(
            f"collector_cls={collector_cls!r}: evaluations run rlcollect's Collector (in the "
            "worker process or actor for the other backends); leave collector_cls unset."
        )


def build_backend(
    backend: str,
    env: Any,
    policy: Any,
    policy_factory: Callable[..., Any] | None,
    settings: EvaluationSettings,
    **options: Any,
) -> EvaluationBackend:
    """The backend `backend` names, after its own requirements are checked."""
    if backend == "thread":
        return LocalBackend(env, policy, policy_factory, settings)
    if is_env(env) or not callable(env):
        raise ValueError(
            f"The {backend!r} backend needs `env` to be a callable (an env factory), because the "
            f"env is built in the worker process or actor; got a {type(env).__name__}."
        )
    if policy_factory is None:
        raise ValueError(
            f"The {backend!r} backend needs `policy_factory` (a callable (env) -> policy), "
            "because the policy is built in the worker process or actor; pass "
            "policy_factory=... instead of policy=..."
        )
    if backend == "process":
        return ProcessBackend(
            env,
            policy_factory,
            settings,
            init_fn=options["init_fn"],
            weight_sync_schemes=options["weight_sync_schemes"],
        )
    return RayBackend(
        env,
        policy_factory,
        settings,
        init_fn=options["init_fn"],
        num_gpus=options["num_gpus"],
        ray_kwargs=options["ray_kwargs"],
    )

"""The "thread" backend: evaluations run in this process, in the thread that asks for them.

`Evaluator.evaluate()` runs one in the caller's thread; `trigger_eval()` in the evaluator's
own thread. With an env factory and a `policy_factory`, the env and the policy are built by the
first evaluation, in the thread that runs it (a dedicated device's CUDA context is then made
there); otherwise they are built at construction.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from rlcollect.collectors.evaluation.runner import EpisodeRunner
from rlcollect.collectors.evaluation.settings import EvaluationSettings, is_env


class LocalBackend:
    """Runs an `EpisodeRunner` in this process, one evaluation at a time.

    Args:
        env: an env, or a factory of one.
        policy: the policy (None with `policy_factory`).
        policy_factory: builds the policy from the env, lazily when `env` is a factory.
        settings: the evaluation's settings.
    """

    def __init__(
        self,
        env: Any,
        policy: Any,
        policy_factory: Callable[..., Any] | None,
        settings: EvaluationSettings,
    ) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._closed = False
        self._runner: EpisodeRunner | None = None
        self._factories: tuple[Any, Callable[..., Any]] | None = None
        if policy_factory is not None and not is_env(env):
            self._factories = (env, policy_factory)
        else:
            self._runner = EpisodeRunner.build(env, policy, policy_factory, settings)

    @property
    def _env(self) -> Any:
        """The env evaluations run in (None until the first evaluation builds it)."""
        return None if self._runner is None else self._runner.env

    @property
    def runner(self) -> EpisodeRunner | None:
        """The runner, once built."""
        return self._runner

    def run(
        self, weights: Mapping[str, Any] | None, step: int, stop: Callable[[], bool]
    ) -> dict[str, Any]:
        """One evaluation, in this thread (after the one in flight, if any)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the evaluator was shut down; build a new Evaluator.")
            if self._runner is None:
                assert self._factories is not None  # one of the two is always set
                env_factory, policy_factory = self._factories
                self._runner = EpisodeRunner.build(
                    env_factory, None, policy_factory, self._settings
                )
                self._factories = None
            try:
                return self._runner.run(weights, step, stop)
            finally:
                if self._closed:  # shut down while it ran: it closes what it used
                    self._close_runner()

    def cancel(self) -> None:
        """Nothing to do: the evaluation in flight asks its `stop` after every env step."""

    def close(self, timeout: float) -> None:
        """Close the env, now or, when an evaluation is still running after `timeout`
        seconds, as soon as it ends."""
        self._closed = True
        if self._lock.acquire(timeout=max(timeout, 0.0)):
            try:
                self._close_runner()
            finally:
                self._lock.release()

    def _close_runner(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.close()

"""`Evaluator`: whole-episode evaluations of a policy, blocking or in the background.

TorchRL's `Evaluator`, with its arguments and their meanings. The front door here keeps the
requests, the results and the one background thread; where an evaluation runs is a backend:
this process (`local.py`), a worker process (`process.py`) or a Ray actor (`ray_actor.py`),
each running the same `EpisodeRunner` (`runner.py`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from rlcollect import keys
from rlcollect.collectors.evaluation.backends import (
    BACKENDS,
    EvaluationBackend,
    build_backend,
    check_choice,
    check_collector_cls,
    check_policy_arguments,
)
from rlcollect.collectors.evaluation.metrics import result_from, result_tensordict
from rlcollect.collectors.evaluation.runner import EvaluationCancelledError
from rlcollect.collectors.evaluation.settings import EvaluationSettings
from rlcollect.collectors.evaluation.weights import extract_weights, prepared_weights

logger = logging.getLogger(__name__)

Backend = Literal["thread", "process", "ray"]
BusyPolicy = Literal["skip", "error", "queue"]
BUSY_POLICIES = ("skip", "error", "queue")
NestedKey = str | tuple[str, ...]
Request = tuple[dict[str, Any] | None, int]
THREAD_NAME = "rlcollect-evaluator"


class Evaluator:
    """Evaluates a policy over whole episodes, blocking or in the background.

    `evaluate()` runs an evaluation and returns its metrics. `trigger_eval()` starts one in
    the background and returns at once; `poll()` and `wait()` hand its result back, and
    `on_result` is called with it. An evaluation loads the weights it is given, plays
    `num_trajectories` whole episodes from a reset of every sub-env (with `exploration_type`,
    deterministic by default) and reports `"<log_prefix>/reward"` (mean return),
    `"reward_std"`, `"num_episodes"`, `"episode_length"` (mean), `"fps"` (env frames per
    second), the user's `metrics_fn` entries and `"step"`. Running statistics of the env's
    transforms (TorchRL's `VecNorm`) are frozen; recorders (`VideoRecorder`) are dumped at
    each evaluation's step. An evaluation that fails raises in `evaluate()`, or in the
    `poll()` / `wait()` that would have returned its result (a worker's or actor's error
    carries its traceback).

    Args:
        env: an env (ours or TorchRL's), or a callable returning one (required by the
            "process" and "ray" backends, which build it where they run).
        policy: the evaluation policy; or give `policy_factory` instead.

    Keyword Args:
        policy_factory: `(env) -> policy` (one taking no argument is called with none);
            required by "process" and "ray". With "thread" and an env factory, both are built
            by the first evaluation, in the thread that runs it.
        num_trajectories: whole episodes per evaluation.
        max_steps: steps after which an episode is truncated (None: until done); an env that
            counts steps itself (a `StepCounter`) keeps its own limit.
        frames_per_batch: env frames per internal batch (default: `min(max_steps, 64)` steps
            of every sub-env); an evaluation stops at the end of the batch in which its last
            episode ends.
        collector_cls: None or `"Collector"` / `Collector`: evaluations run our `Collector`.
        collector_kwargs: other `Collector` options; `traj_format` ("padded", "cat") lays
            out the episodes `metrics_fn` receives.
        weight_sync_schemes: `{"policy": scheme}`: how weights reach the worker process;
            given with the "thread" backend, evaluations run in a worker process (TorchRL's).
        log_prefix: the prefix of every metric's name.
        reward_keys: the reward summed over an episode (a `RewardSum`'s `episode_reward` is
            read instead when the env has one).
        done_keys: the flag that ends an episode (a step limit's truncation does too).
        device: the policy's device (the collector's `policy_device`).
        exploration_type: the interaction type the policy runs under.
        metrics_fn: `(episodes) -> {name: value}`, on the batch of the episodes played.
        dump_video: dump the env's recorders after each evaluation.
        on_result: called with each result as a flat TensorDict (from the background thread
            for `trigger_eval`); its exceptions are logged, not raised.
        busy_policy: what `trigger_eval()` does while an evaluation is pending: "skip"
            (return False), "error" (raise) or "queue" (run it next; each queued request holds
            a copy of its weights).
        backend: "thread" (this process), "process" (a worker process) or "ray" (an actor).
        init_fn: called first in the worker process or actor ("thread" ignores it).
        num_gpus: GPUs of the Ray actor.
        ray_kwargs: other `ray.remote` options of the actor.
        seed: ours: every evaluation seeds its env with it first (sub-env i gets `seed + i`),
            so that evaluations of different weights play from the same first states and
            their returns compare the weights (None: the env's generator goes on).

    Examples:
        >>> import torch
        >>> from tensordict.nn import TensorDictModule
        >>> from rlcollect.collectors import Evaluator
        >>> from rlcollect.testing.counting import CountingEnv
        >>> policy = TensorDictModule(
        ...     lambda obs: torch.zeros(obs.shape[:-1], dtype=torch.int64),
        ...     in_keys=["observation"],
        ...     out_keys=["action"],
        ... )
        >>> evaluator = Evaluator(CountingEnv(episode_length=5), policy, num_trajectories=3)
        >>> metrics = evaluator.evaluate(step=0)
        >>> metrics["eval/num_episodes"], metrics["eval/reward"], metrics["eval/episode_length"]
        (3, 5.0, 5.0)
        >>> evaluator.trigger_eval(step=1)
        True
        >>> evaluator.wait(timeout=60)["eval/step"]
        1
        >>> evaluator.shutdown()
    """

    def __init__(
        self,
        env: Any,
        policy: Any = None,
        *,
        policy_factory: Callable[..., Any] | None = None,
        num_trajectories: int = 10,
        max_steps: int | None = None,
        frames_per_batch: int | None = None,
        collector_cls: Any = None,
        collector_kwargs: Mapping[str, Any] | None = None,
        weight_sync_schemes: Mapping[str, Any] | None = None,
        log_prefix: str = "eval",
        reward_keys: NestedKey = (keys.NEXT, keys.REWARD),
        done_keys: NestedKey = (keys.NEXT, keys.DONE),
        device: torch.device | str | None = None,
        exploration_type: InteractionType = InteractionType.DETERMINISTIC,
        metrics_fn: Callable[[TensorDictBase], Mapping[str, Any]] | None = None,
        dump_video: bool = True,
        on_result: Callable[[TensorDictBase], None] | None = None,
        busy_policy: BusyPolicy = "skip",
        backend: Backend = "thread",
        init_fn: Callable[[], None] | None = None,
        num_gpus: float = 1,
        ray_kwargs: Mapping[str, Any] | None = None,
        seed: int | None = None,
    ) -> None:
        check_choice("backend", backend, BACKENDS)
        check_choice("busy_policy", busy_policy, BUSY_POLICIES)
        check_policy_arguments(policy, policy_factory)
        check_collector_cls(collector_cls)
        if on_result is not None and not callable(on_result):
            raise TypeError(f"on_result must be a callable taking the result; got {on_result!r}.")
        options = dict(collector_kwargs or {})
        if device is not None:
            options.setdefault("policy_device", torch.device(device))
        self._settings = EvaluationSettings.validate(
            num_trajectories=num_trajectories,
            max_steps=max_steps,
            frames_per_batch=frames_per_batch,
            exploration_type=exploration_type,
            collector_kwargs=options,
            reward_keys=reward_keys,
            done_keys=done_keys,
            metrics_fn=metrics_fn,
            dump_video=dump_video,
            seed=seed,
        )
        self._log_prefix = log_prefix
        self._on_result = on_result
        self._busy_policy = busy_policy
        self._step_counter = 0
        # One evaluation at a time on the backend; the background thread's state under a lock.
        self._run_lock = threading.Lock()
        self._async_lock = threading.Condition()
        self._async_requests: deque[Request] = deque()
        self._ready_results: deque[dict[str, Any] | BaseException] = deque()
        self._running = False
        self._closing = False
        self._thread: threading.Thread | None = None
        where = "process" if backend == "thread" and weight_sync_schemes else backend
        self._backend: EvaluationBackend = build_backend(
            where,
            env,
            policy,
            policy_factory,
            self._settings,
            init_fn=init_fn,
            weight_sync_schemes=weight_sync_schemes,
            num_gpus=num_gpus,
            ray_kwargs=ray_kwargs,
        )

    # --- blocking -------------------------------------------------------------------------------

    def evaluate(
        self,
        weights: Any = None,
        step: int | None = None,
        *,
        weights_dict: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Run one evaluation now (after a background one in flight) and return its result.

        Args:
            weights: the policy's weights to load first: a module or a TensorDict (or state
                dict) of its weights; None keeps those it has.
            step: the logging step reported as `"<prefix>/step"` (None: 0, 1, 2, ...).

        Keyword Args:
            weights_dict: `{model_id: weights}` for several models (`"policy"`, or an
                attribute path such as `"env.transform[0]"`); `weights` fills `"policy"`
                when the dict has none.

        Raises:
            ValueError / TypeError: weights that do not fit the policy.
            WorkerError / ActorError: the worker process or the actor failed.
        """
        prepared = prepared_weights(weights, weights_dict)
        step = self._next_step(step)
        result = self._run((prepared, step))
        self._deliver(result)
        return result

    # --- in the background ----------------------------------------------------------------------

    def trigger_eval(
        self,
        weights: Any = None,
        step: int | None = None,
        *,
        weights_dict: Mapping[str, Any] | None = None,
    ) -> bool:
        """Start an evaluation in the background (arguments as `evaluate()`; the weights are
        copied now) and return True; or, while one is pending, follow `busy_policy`:
        return False ("skip"), raise ("error") or queue it ("queue", returning True).

        Raises:
            RuntimeError: busy with `busy_policy="error"`, or after `shutdown()`.
        """
        prepared = prepared_weights(weights, weights_dict)
        with self._async_lock:
            if self._closing:
                raise RuntimeError("trigger_eval() after shutdown(); build a new Evaluator.")
            if self._busy():
                if self._busy_policy == "error":
                    raise RuntimeError(
                        "an evaluation is already pending; wait for it (wait() or poll()), or "
                        "build the Evaluator with busy_policy='skip' or busy_policy='queue'."
                    )
                if self._busy_policy == "skip":
                    return False
            self._async_requests.append((prepared, self._next_step(step)))
            self._ensure_thread()
            self._async_lock.notify_all()
        return True

    def poll(self, timeout: float = 0) -> dict[str, Any] | None:
        """The oldest result not yet handed back, waiting up to `timeout` seconds for one
        (0: not at all); None when there is none.

        Raises:
            Exception: the error of the background evaluation that failed, instead of its
                result (a `WorkerError` or `ActorError` carries the worker's traceback).
        """
        return self._take(timeout)

    def wait(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The oldest result not yet handed back, waiting for the pending evaluation
        (`timeout` seconds at most; None: as long as it runs). None when nothing is pending
        and no result is left, or on timeout.

        Raises:
            Exception: the error of the background evaluation that failed, instead of its
                result (a `WorkerError` or `ActorError` carries the worker's traceback).
        """
        return self._take(timeout, until_idle=True)

    @property
    def pending(self) -> bool:
        """Whether a background evaluation is running or queued (False once shut down)."""
        with self._async_lock:
            return not self._closing and self._busy()

    # --- life cycle -----------------------------------------------------------------------------

    def shutdown(self, timeout: float = 5.0) -> None:
        """Drop the queued evaluations, end the one in flight (within `timeout` seconds: a
        worker process or actor is ended, a thread stops at its next env step) and release
        the env, worker process or actor. Unread results are dropped. Idempotent."""
        with self._async_lock:
            self._closing = True
            self._async_requests.clear()
            self._async_lock.notify_all()
        self._backend.cancel()
        deadline = time.monotonic() + timeout
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._backend.close(max(0.0, deadline - time.monotonic()))
        with self._async_lock:
            self._ready_results.clear()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.shutdown(timeout=2.0)

    def state_dict(self) -> dict[str, Any]:
        """The evaluator's progress (its step counter), when nothing is pending or unread.

        Raises:
            RuntimeError: evaluations pending, queued, or unread.
        """
        with self._async_lock:
            self._check_quiet("checkpointing")
            return {"step_counter": self._step_counter}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore `state_dict()`'s progress, when nothing is pending or unread.

        Raises:
            RuntimeError: evaluations pending, queued, or unread.
        """
        with self._async_lock:
            self._check_quiet("restoring a state")
            self._step_counter = int(state_dict.get("step_counter", 0))

    extract_weights = staticmethod(extract_weights)

    # --- internals ------------------------------------------------------------------------------

    def _check_quiet(self, action: str) -> None:
        if self._busy() or self._ready_results:
            raise RuntimeError(
                f"{action} needs an evaluator with no pending, queued, or unread evaluation "
                "results; wait() for them first."
            )

    def _busy(self) -> bool:
        return self._running or bool(self._async_requests)

    def _next_step(self, step: int | None) -> int:
        if step is not None:
            return int(step)
        step, self._step_counter = self._step_counter, self._step_counter + 1
        return step

    def _stop_requested(self) -> bool:
        return self._closing

    def _run(self, request: Request) -> dict[str, Any]:
        weights, step = request
        with self._run_lock:
            raw = self._backend.run(weights, step, self._stop_requested)
        return result_from(raw, self._log_prefix, step)

    def _deliver(self, result: dict[str, Any]) -> None:
        if self._on_result is None:
            return
        try:
            self._on_result(result_tensordict(result))
        except Exception:
            logger.warning("Evaluator: the on_result callback failed", exc_info=True)

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._serve, name=THREAD_NAME, daemon=True)
            self._thread.start()

    def _serve(self) -> None:
        """The background thread: run the queued requests in order until shutdown."""
        while True:
            with self._async_lock:
                while not self._async_requests and not self._closing:
                    self._async_lock.wait()
                if self._closing:
                    return
                request = self._async_requests.popleft()
                self._running = True
            outcome: dict[str, Any] | BaseException | None
            try:
                outcome = self._run(request)
                self._deliver(outcome)
            except EvaluationCancelledError:
                outcome = None
            except BaseException as err:  # handed to poll() / wait()
                outcome = None if self._closing else err
            with self._async_lock:
                self._running = False
                if outcome is not None and not self._closing:
                    self._ready_results.append(outcome)
                self._async_lock.notify_all()

    def _take(self, timeout: float | None, until_idle: bool = False) -> dict[str, Any] | None:
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        with self._async_lock:
            while not self._ready_results:
                if until_idle and not self._busy():
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._async_lock.wait(left)
            outcome = self._ready_results.popleft()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

"""The "process" backend: evaluations run in one worker process (`worker.py`).

The worker is started by the first evaluation, through the one worker-process mechanism of
`rlcollect.runtime.processes` (preloaded fork server, lifeline, error replies with the worker's
traceback, bounded shutdown). It reports its policy's weights layout when ready, so weights are
checked here before anything is sent, and they travel by the policy's weight sync scheme as the
multi-process collectors send them (`MultiProcessWeightSyncScheme` by default: pickled through
the pipe, once per evaluation, as TorchRL's process evaluator sends them). Weights of other
models (`weights_dict` ids such as `"env.transform[0]"`) travel pickled.

A worker that dies is reported by the evaluation it was running (a `WorkerError` with how it
ended); the next evaluation starts a fresh one.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable, Mapping
from multiprocessing.reduction import ForkingPickler
from typing import Any, cast

import torch

from rlcollect.collectors.evaluation.settings import EvaluationSettings
from rlcollect.collectors.evaluation.spec import EvaluationWorkerSpec
from rlcollect.collectors.evaluation.worker import (
    EvaluationCommand,
    describe_command,
    run_evaluation_worker,
)
from rlcollect.collectors.multiprocess.pool import remove_orphaned_segments
from rlcollect.collectors.policy.weights import (
    Weights,
    WeightsLayout,
    flat_weights,
    layout_template,
    validated_weights,
)
from rlcollect.collectors.weights.schemes import (
    POLICY_MODEL_ID,
    MultiProcessWeightSyncScheme,
    WeightSyncScheme,
    check_schemes,
)
from rlcollect.errors import WorkerError, WorkerRaisedError
from rlcollect.runtime.payload import WorkerPayload
from rlcollect.runtime.processes import (
    WorkerHandle,
    encode,
    shut_down_workers,
    worker_context,
    workers_finalizer,
)

# Seconds a worker gets to close its env before it is terminated.
CLOSE_TIMEOUT = 10.0


def policy_scheme(weight_sync_schemes: Mapping[str, Any] | None) -> WeightSyncScheme:
    """The scheme the policy's weights travel by: `weight_sync_schemes["policy"]` (ours or
    TorchRL's), else `MultiProcessWeightSyncScheme`."""
    schemes = check_schemes("weight_sync_schemes", weight_sync_schemes, other_models=True)
    return schemes.get(POLICY_MODEL_ID) or MultiProcessWeightSyncScheme()


class ProcessBackend:
    """Runs an `EpisodeRunner` in one worker process.

    Args:
        env_factory: builds the env in the worker.
        policy_factory: builds the policy in the worker, from the env.
        settings: the evaluation's settings.

    Keyword Args:
        init_fn: called first thing in the worker (TorchRL's, e.g. to start a simulator).
        weight_sync_schemes: `{"policy": scheme}`, as the multi-process collectors take it.
        mp_start_method: "forkserver" (default where available) or "spawn".
        startup_timeout: seconds the worker may take to build the env and the policy.
    """

    def __init__(
        self,
        env_factory: Callable[[], Any],
        policy_factory: Callable[..., Any],
        settings: EvaluationSettings,
        *,
        init_fn: Callable[[], None] | None = None,
        weight_sync_schemes: Mapping[str, Any] | None = None,
        mp_start_method: str | None = None,
        startup_timeout: float = 300.0,
    ) -> None:
        self.scheme = policy_scheme(weight_sync_schemes)
        # The env factory's tensors in shared memory reach the worker shared (as the
        # multi-process collectors' env makers'); the policy factory's are copied. The worker
        # finds the factory itself in the spec: a payload in a payload is loaded in place.
        env_payload = cast("Callable[[], Any]", WorkerPayload(env_factory, share_tensors=True))
        self._spec = WorkerPayload(
            EvaluationWorkerSpec(env_payload, policy_factory, settings, self.scheme, init_fn)
        )
        self._context = worker_context(mp_start_method)
        self._startup_timeout = startup_timeout
        self._connected = False
        self.template: Weights | None = None
        self._lock = threading.Lock()  # one exchange with the worker at a time
        self._busy = False
        self._closed = False
        self._handles: list[WorkerHandle] = []
        self._finalizer = workers_finalizer(
            self, self._handles, encode(EvaluationCommand.CLOSE), CLOSE_TIMEOUT
        )

    @property
    def pid(self) -> int | None:
        """The worker's process id (None before the first evaluation starts it)."""
        return self._handles[0].pid if self._handles else None

    def run(
        self, weights: Mapping[str, Any] | None, step: int, stop: Callable[[], bool]
    ) -> dict[str, Any]:
        """One evaluation in the worker, waited for (the worker's liveness is checked while
        waiting). `stop` is not asked: `cancel()` ends the worker instead."""
        with self._lock:
            handle = self._started()
            payload = pickle.dumps(self._pack(weights or {}))
            reply = self._exchange(handle, encode(EvaluationCommand.EVALUATE, step, payload))
            return pickle.loads(reply)  # type: ignore[no-any-return]

    def policy_state(self) -> dict[str, torch.Tensor]:
        """The state dict of the policy the worker runs (it starts the worker if needed)."""
        with self._lock:
            handle = self._started()
            reply = self._exchange(handle, encode(EvaluationCommand.POLICY_STATE))
            return pickle.loads(reply)  # type: ignore[no-any-return]

    def _exchange(self, handle: WorkerHandle, message: bytes) -> bytes:
        """Send `message` and wait for its reply; a worker that died is let go, so the next
        evaluation starts a fresh one."""
        self._busy = True
        try:
            handle.send(message)
            return handle.receive(None)
        except WorkerRaisedError:
            raise  # it is alive and answered: it goes on
        except WorkerError:
            self._let_go()
            raise
        finally:
            self._busy = False

    def _started(self) -> WorkerHandle:
        if self._closed:
            raise RuntimeError("the evaluator was shut down; build a new Evaluator.")
        if self._handles:
            return self._handles[0]
        handle = WorkerHandle(
            0,
            self._context,
            run_evaluation_worker,
            (self._spec,),
            name="rlcollect-evaluation-worker",
            daemon=False,  # its env may start processes of its own (a ParallelEnv)
            describe=describe_command,
        )
        self._handles.append(handle)
        self._busy = True  # building: cancel() ends it too
        try:
            layout: WeightsLayout = pickle.loads(handle.receive(self._startup_timeout))
            self._connect(handle, layout)
        except BaseException:
            self._let_go()
            raise
        finally:
            self._busy = False
        return handle

    def _connect(self, handle: WorkerHandle, layout: WeightsLayout) -> None:
        """Learn the weights layout; connect the scheme (once) and hand its channel, if it
        has one (shared memory), to the worker."""
        self.template = layout_template(layout)
        if not self._connected and layout:
            zeros = {
                name: torch.zeros(shape, dtype=dtype) for name, (shape, dtype) in layout.items()
            }
            self.scheme.connect(zeros, 1)
            self._connected = True
        channel = self.scheme.channel(0) if self._connected else None
        if channel is not None:
            payload = bytes(ForkingPickler.dumps(channel))
            handle.send(encode(EvaluationCommand.CHANNEL, 0, payload))
            handle.receive(self._startup_timeout)

    def _pack(self, weights: Mapping[str, Any]) -> tuple[bytes | None, dict[str, Weights]]:
        """The policy's weights checked and packed by the scheme, and the other models'.

        Raises:
            TypeError: policy weights for a policy that has none.
            ValueError: weights that do not match the policy's names, shapes or dtypes.
        """
        models = {
            model_id: {name: t.detach().cpu() for name, t in flat_weights(source).items()}
            for model_id, source in weights.items()
            if model_id != POLICY_MODEL_ID
        }
        if POLICY_MODEL_ID not in weights:
            return None, models
        if not self.template:
            raise TypeError(
                "weights were given, but the evaluation policy the worker built has none to "
                "load: loading weights requires an nn.Module policy with parameters or "
                "buffers. Leave weights out, or have policy_factory build a module."
            )
        checked = validated_weights(weights[POLICY_MODEL_ID], self.template)
        if not self.scheme.sends_weights:
            return None, models
        return self.scheme.pack({name: t.cpu() for name, t in checked.items()}), models

    def _let_go(self) -> None:
        """Forget a worker that died (or never got ready), removing what it left."""
        while self._handles:
            handle = self._handles.pop()
            pid = handle.pid
            handle.finish(timeout=0.1)
            remove_orphaned_segments(pid)

    def cancel(self) -> None:
        """End the worker at once if it is running an evaluation (the evaluation waiting for
        it then fails, and is dropped by the shutting-down evaluator)."""
        self._closed = True
        if self._busy and self._handles:
            self._handles[0].process.kill()

    def close(self, timeout: float) -> None:
        """Stop the worker (bounded: terminated if it does not exit within `timeout`
        seconds), remove what it left in shared memory and release the scheme. Idempotent."""
        self._closed = True
        acquired = self._lock.acquire(timeout=max(timeout, 0.0))
        try:
            pids = [handle.pid for handle in self._handles]
            if not acquired:  # a thread still waits on it: end it so that thread returns
                self.cancel()
            shut_down_workers(self._handles, encode(EvaluationCommand.CLOSE), timeout)
            for pid in pids:
                remove_orphaned_segments(pid)
            self.scheme.close()
        finally:
            if acquired:
                self._lock.release()

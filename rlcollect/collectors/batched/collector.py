"""`AsyncBatchedCollector`: env workers that only step envs, one inference server that batches
the policy calls of all of them (Sample Factory's and SEED RL's split, TorchRL's collector of
that name).

The env workers are the multi-process collector's workers (`MultiAsyncCollector`: one worker
mechanism, its restarts, replay buffers and error reports), each running the one rollout loop
with a client of the server as its policy. The server (`server.py`) holds the only copy of the
policy, in a thread of this process or in a process of its own. Observations and answers move
through shared-memory slots written in place (`slots.py`); each worker hands back chunks of
consecutive steps, which this collector gathers into batches.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType

from rlcollect import keys
from rlcollect.collectors.base import CollectorBase
from rlcollect.collectors.batched.client import ClientFactory, InferenceServerError
from rlcollect.collectors.batched.options import (
    Sizes,
    batching_from,
    check_exchange,
    check_policy_source,
    check_unsupported,
    devices_from,
    env_backend_from,
    env_makers,
)
from rlcollect.collectors.batched.probe import Entry, probe_layout
from rlcollect.collectors.batched.server import ServedPolicy, start_server
from rlcollect.collectors.batched.slots import SharedSlots
from rlcollect.collectors.batched.trajectories import CompletedTrajectories
from rlcollect.collectors.children import WorkerView, check_worker_view, worker_view
from rlcollect.collectors.multiprocess.async_collector import MultiAsyncCollector
from rlcollect.collectors.options import BatchOptions, check_int
from rlcollect.envs.serial import SerialEnv
from rlcollect.errors import MisuseError, WorkerError


def grouped_env(makers: list[Callable[[], Any]]) -> Any:
    """One worker's envs: the env itself, or a `SerialEnv` of several."""
    return makers[0]() if len(makers) == 1 else SerialEnv(len(makers), makers)


class WorkerWatch:
    """An env worker's process as TorchRL's tests see it: `join(timeout)`, `is_alive()`, also
    after the collector has released it."""

    def __init__(self, process: Any) -> None:
        self._process = process

    def is_alive(self) -> bool:
        try:
            return bool(self._process.is_alive())
        except ValueError:  # released at shutdown: it is gone
            return False

    def join(self, timeout: float | None = None) -> None:
        try:
            self._process.join(timeout)
        except (ValueError, AssertionError):
            return


def _close_parts(server: Any, slots: SharedSlots) -> None:
    try:
        server.close()
    finally:
        slots.close()


class AsyncBatchedCollector(CollectorBase):
    """Env workers that only step envs; one inference server batches all their policy calls.

    Each env worker is a process (`MultiAsyncCollector`'s) running the rollout loop over
    `envs_per_worker` envs; its policy is a client that writes the observations into the
    worker's shared-memory rows and waits for the server. The server gathers the pending
    requests (up to `max_batch_size` rows; once it holds `min_batch_size` rows, or after
    `server_timeout` seconds), runs the policy once, writes the answers and the policy version
    into the rows, and wakes the workers. Workers hand back chunks of
    `transition_chunk_size` consecutive steps; a batch is whole chunks of several workers:
    `[rows, transition_chunk_size]` with dims named `[None, "time"]`, each row one env's
    consecutive steps, with TorchRL's keys, the trajectory ids of every env (unique over all
    workers and restarts) and, per frame, the `policy_version_key` of the weights that chose
    the action.

    Args:
        create_env_fn: one env maker per env (callables, Gymnasium ids or envs).

    Keyword Args:
        policy: the policy to serve (a private copy is served; the module given is where
            `update_policy_weights_()` reads new weights).
        policy_factory: builds the policy where it is served (required to build it in the
            server process without pickling a module). One of the two.
        frames_per_batch: frames per batch (rounded up to whole chunks, with a warning).
        total_frames: frames over the collector's life (-1: forever).
        max_batch_size / min_batch_size / server_timeout: the server's batching (rows of
            envs); or `server_config` (TorchRL's `InferenceServerConfig`, whose
            `service_backend` "thread" or "process" says where the server runs).
        concurrent_forwards: forwards the server runs at once, each in a thread of its own
            taking the requests waiting when it is free (ours; default 1). On CPUs, small
            batches leave cores idle that a second forward uses; the policy must then be safe
            to call from several threads at once (no state changed in its forward).
        device / device_config: the policy's device (TorchRL's `InferenceDeviceConfig`:
            envs, outputs and batches stay on the CPU here).
        backend / env_backend / policy_backend / env_exchange / transport: TorchRL's
            switches, checked; env workers are always processes and data always moves
            through shared slots (see the guide).
        envs_per_worker: envs stepped by one worker (`len(create_env_fn)` must be a
            multiple).
        transition_chunk_size: consecutive steps per env a worker hands back at once
            ("auto": at least 64, one batch's share per env when larger, at most a batch).
        reset_at_each_iter: every worker's chunk starts from a reset.
        postproc / post_collect_hook: applied to every gathered batch, in this order.
        exploration_type: the interaction type the server runs the policy under (TorchRL's
            `ExplorationType`; default random).
        replay_buffer: the workers extend it with their chunks; iteration yields None.
        yield_completed_trajectories: yield whole trajectories as they end (at least
            `frames_per_batch` frames, concatenated along time) instead of fixed batches.
        weight_sync: a receive scheme (an object with `receive()`), polled before every
            batch.
        weight_sync_model_id: must be "policy".
        create_env_kwargs: keyword arguments of the env makers (one dict, or one per env).
        policy_version / policy_version_key: the first version, and the key of the per-frame
            version (None: no such key).
        restart_dead_workers: replace an env worker that dies instead of failing.
        worker_timeout: seconds a worker may take for one chunk.
        mp_start_method: how workers (and a server process) start.

    Raises:
        TypeError: both or neither of `policy` and `policy_factory`.
        ValueError: an unknown backend, contradictory arguments (each message names them).

    Examples:
        >>> import torch
        >>> from tensordict.nn import TensorDictModule
        >>> from rlcollect.collectors import AsyncBatchedCollector
        >>> def push_right(observation):
        ...     return torch.nn.functional.one_hot(torch.ones_like(observation[..., 0]).long(), 2)
        >>> policy = TensorDictModule(push_right, in_keys=["observation"], out_keys=["action"])
        >>> with AsyncBatchedCollector(
        ...     ["CartPole-v1"] * 2,
        ...     policy=policy,
        ...     frames_per_batch=40,
        ...     total_frames=80,
        ...     transition_chunk_size=20,
        ... ) as collector:
        ...     batches = list(collector)
        >>> [tuple(batch.shape) for batch in batches], batches[0].names
        ([(2, 20), (2, 20)], [None, 'time'])
        >>> int(batches[-1]["policy_version"].max()), collector.server_backend
        (0, 'thread')
    """

    def __init__(
        self,
        create_env_fn: Any,
        *,
        policy: Any = None,
        policy_factory: Callable[[], Any] | None = None,
        frames_per_batch: int,
        total_frames: int = -1,
        max_batch_size: int | None = None,
        min_batch_size: int | None = None,
        server_timeout: float | None = None,
        concurrent_forwards: int = 1,
        transport: Any = None,
        device: Any = None,
        backend: str | None = None,
        env_backend: str | None = None,
        env_exchange: str = "auto",
        envs_per_worker: int = 1,
        transition_chunk_size: int | str = "auto",
        policy_backend: str | None = None,
        reset_at_each_iter: bool = False,
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        exploration_type: Any = None,
        replay_buffer: Any = None,
        post_collect_hook: Callable[[TensorDictBase], Any] | None = None,
        yield_completed_trajectories: bool = False,
        weight_sync: Any = None,
        weight_sync_model_id: str = "policy",
        verbose: bool = False,
        create_env_kwargs: Any = None,
        worker_affinity: Any = None,
        driver_affinity: Any = None,
        server_config: Any = None,
        device_config: Any = None,
        policy_version: int = 0,
        policy_version_key: Any = keys.POLICY_VERSION,
        restart_dead_workers: bool = False,
        worker_timeout: float | None = 300.0,
        mp_start_method: str | None = None,
    ) -> None:
        del verbose  # progress goes to stats()
        check_policy_source(policy, policy_factory)
        batching, server_kind = batching_from(
            server_config, max_batch_size, min_batch_size, server_timeout, concurrent_forwards
        )
        devices = devices_from(device, device_config)
        self.env_backend = env_backend_from(backend, env_backend, policy_backend)
        check_exchange(env_exchange, transport)
        check_unsupported(worker_affinity, driver_affinity, weight_sync_model_id)
        makers = env_makers(create_env_fn, create_env_kwargs)
        sizes = Sizes.of(
            len(makers),
            envs_per_worker,
            transition_chunk_size,
            frames_per_batch,
            total_frames,
            whole_trajectories=bool(yield_completed_trajectories),
        )
        self._num_envs, self.num_workers = sizes.num_envs, sizes.num_workers
        self.envs_per_worker, self.chunk_size = sizes.envs_per_worker, sizes.chunk_size
        self._chunks_per_batch = sizes.chunks_per_batch
        self._min_trajectory_frames = sizes.requested_frames
        self.frames_per_batch, self.total_frames = sizes.frames_per_batch, sizes.total_frames
        self.yield_completed_trajectories = bool(yield_completed_trajectories)
        self.options = BatchOptions.validate(
            postproc=postproc,
            split_trajs=False,
            return_same_td=False,
            replay_buffer=replay_buffer,
            extend_buffer=True,
            weight_sync_schemes=None,
            weight_recv_schemes={"policy": weight_sync} if weight_sync is not None else None,
            post_collect_hook=post_collect_hook,
        )
        self.policy_version = check_int("policy_version", policy_version)
        self._policy = policy
        exploration_type = exploration_type or InteractionType.RANDOM
        # --- the slots, from one env and one policy pass; the server; the env workers ---
        probe = probe_layout(
            makers[0],
            policy if policy is not None else policy_factory(),  # type: ignore[misc]
            exploration_type,
        )
        if probe.env_batch_size:
            raise ValueError(
                f"create_env_fn makes an env of batch size {list(probe.env_batch_size)}; "
                "AsyncBatchedCollector serves one env per maker, as TorchRL's: pass one maker "
                "of a single env per env (e.g. [make_env] * 8), and the server batches them."
            )
        self._wraps_module = policy is not None and probe.policy is not policy
        versions: list[Entry] = (
            [] if policy_version_key is None else [(policy_version_key, (), torch.int64)]
        )
        self._slots = SharedSlots(
            self._num_envs, self.envs_per_worker, probe.requests, probe.responses + versions
        )
        served = ServedPolicy.of(
            probe,
            policy_factory,
            device=devices.policy_device,
            exploration_type=exploration_type,
            batching=batching,
            policy_version=self.policy_version,
            has_version=policy_version_key is not None,
        )
        try:
            self._server = start_server(server_kind, served, self._slots.layout, mp_start_method)
        except BaseException:
            self._slots.close()
            raise
        self._finalizer = weakref.finalize(self, _close_parts, self._server, self._slots)
        try:
            self._inner = self._start_workers(
                makers,
                replay_buffer=replay_buffer,
                reset_at_each_iter=reset_at_each_iter,
                restart_dead_workers=restart_dead_workers,
                worker_timeout=worker_timeout,
                postproc=postproc if replay_buffer is not None else None,
                mp_start_method=mp_start_method,
            )
        except BaseException:
            self._finalizer()
            raise
        self._frames = 0
        self.iterations = 0
        self._start_time: float | None = None
        self._trajectories = CompletedTrajectories()

    def _start_workers(
        self, makers: list[Callable[[], Any]], **options: Any
    ) -> MultiAsyncCollector:
        """The env workers: `MultiAsyncCollector`'s processes, each running the loop over its
        group of envs with a client of the server as its policy, a chunk per batch."""
        per_worker = self.envs_per_worker
        groups = [makers[w * per_worker : (w + 1) * per_worker] for w in range(self.num_workers)]
        layout = self._slots.layout
        return MultiAsyncCollector(
            [functools.partial(grouped_env, group) for group in groups],
            policy_factory=[
                ClientFactory(layout, worker, self._server.pid)
                for worker in range(self.num_workers)
            ],
            frames_per_batch=self.chunk_size * per_worker,
            # Workers that write a buffer stop at total_frames; others are stopped by next().
            total_frames=self.total_frames if options["replay_buffer"] is not None else -1,
            **options,
        )

    # --- TorchRL's attributes ---------------------------------------------------------------

    @property
    def server_backend(self) -> str:
        """Where the server runs: "thread" or "process"."""
        return self._server.kind

    @property
    def _workers(self) -> list[WorkerWatch]:
        return [WorkerWatch(slot.handle.process) for slot in self._inner.pool.slots]

    def process_ids(self) -> list[int]:
        """Every process below this collector: its env workers (restarted ones as they are
        now) and, with a server process, the server."""
        pids = self._inner.process_ids()
        if self._server.kind == "process":
            pids.append(self._server.pid)
        return pids

    def server_stats(self) -> dict[str, Any]:
        """The server's counts: requests, forwards (`batches`), rows, `avg_batch_size`,
        `policy_version`, its last failure (None), and the torch threads it runs with."""
        return self._server.stats()

    # --- iteration --------------------------------------------------------------------------

    @property
    def frames(self) -> int:  # type: ignore[override]  # the workers count buffer writes
        if self.options.replay_buffer is not None:
            return self._inner.frames
        return self._frames

    def next(self) -> TensorDictBase | None:
        """The next batch: whole chunks of several workers (or whole trajectories), None when
        the workers fill a replay buffer.

        Raises:
            StopIteration: `total_frames` have been collected.
            InferenceServerError: the server died or its policy raised (with its traceback).
            WorkerError: an env worker failed (with its traceback) or died.
        """
        if self.is_done:
            raise StopIteration
        self._check_open()
        self._receive_from_schemes()
        if self._start_time is None:
            self._start_time = time.perf_counter()
        if self.options.replay_buffer is not None:
            self._inner_next()
            self.iterations += 1
            return None
        if self.yield_completed_trajectories:
            batch = self._next_trajectories()
        else:
            chunks = [self._as_rows(self._inner_next()) for _ in range(self._chunks_per_batch)]
            batch = cast(TensorDictBase, torch.cat(chunks, 0)) if len(chunks) > 1 else chunks[0]  # type: ignore[arg-type]
            batch.refine_names(None, keys.TIME_DIM_NAME)
        self._frames += batch.numel()
        self.iterations += 1
        for process in self.options.pipeline:
            batch = process(batch)
        return batch

    def _as_rows(self, chunk: TensorDictBase) -> TensorDictBase:
        """A worker's chunk as `[envs, steps]` (a single env's `[steps]` gets a row dim)."""
        return chunk.unsqueeze(0) if chunk.batch_dims == 1 else chunk

    def _next_trajectories(self) -> TensorDictBase:
        while self._trajectories.frames < self._min_trajectory_frames:
            self._trajectories.add(self._as_rows(self._inner_next()))
        return self._trajectories.take(self._min_trajectory_frames)

    def _inner_next(self) -> TensorDictBase:
        try:
            batch = self._inner.next()
        except WorkerError as err:
            failure = self._server_failure()
            self.shutdown(raise_on_error=False)
            if failure is not None:
                raise InferenceServerError(failure) from err
            raise
        return batch  # type: ignore[return-value]

    def _server_failure(self) -> str | None:
        """What went wrong in the server, in a sentence with its traceback, or None."""
        if not self._server.is_alive:
            how = self._server.failure() if self._server.kind == "process" else "it stopped"
            return f"the inference server died: {how}."
        failure = self._server.failure()
        if failure is None:
            return None
        return f"the inference server's policy raised while serving the workers: {failure}"

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise MisuseError("the collector is shut down; build a new one.")

    # --- weights ----------------------------------------------------------------------------

    def _update_weights(
        self, source: Any, policy_id: str | None, worker_ids: Any, timeout: float | None
    ) -> None:
        del policy_id, worker_ids, timeout  # one server holds the only copy
        self.apply_weights(self._weights_from(source), self.policy_version + 1)

    def apply_weights(
        self, weights: Any, version: int, timeout: float | None = None, worker_ids: Any = None
    ) -> None:
        """Load `weights` into the served policy as `version`; returns once the server uses
        them (the next forward answers with them)."""
        self._check_open()
        self._server.update(self._weights_from(weights), version)
        self.policy_version = version

    def _weights_from(self, source: Any) -> TensorDictBase:
        """`source` (a module, a state dict, a TensorDict; None: the policy given) as the
        served policy's parameters, detached copies on the CPU."""
        if source is None:
            if self._policy is None:
                raise ValueError(
                    "update_policy_weights_() with no weights reads them from the policy, and "
                    "this collector was built from policy_factory; pass the weights (the "
                    "trained module or its state_dict())."
                )
            source = self._policy
        if isinstance(source, torch.nn.Module):
            weights = TensorDict.from_module(source)
        elif isinstance(source, TensorDictBase):
            weights = source
        elif isinstance(source, Mapping):
            weights = TensorDict(dict(source)).unflatten_keys(".")
        else:
            raise TypeError(
                f"weights must be a module, a state dict or a TensorDict; got "
                f"{type(source).__name__}."
            )
        if self._wraps_module and "module" not in weights:
            weights = TensorDict({"module": weights})
        return weights.detach().to("cpu").clone()

    def _policy_model(self) -> Any:
        return self._policy

    # --- state, seeds, statistics -----------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "frames": self.frames,  # with a replay buffer, what the workers wrote
            "iterations": self.iterations,
            "policy_version": self.policy_version,
            "workers": self._inner.state_dict(),
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._inner.load_state_dict(state_dict["workers"])
        self._frames = int(state_dict["frames"])
        self.iterations = int(state_dict["iterations"])

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed the env workers apart (see `MultiAsyncCollector.set_seed`)."""
        return self._inner.set_seed(seed, static_seed)

    def reset(self, index: Any = None) -> None:
        self._inner.reset(index)

    def assign_trajectory_ids(self, offset: int, stride: int) -> None:
        self._inner.assign_trajectory_ids(offset, stride)

    def stats(self, workers: WorkerView = "aggregate") -> dict[str, Any]:
        """The workers' statistics (`MultiAsyncCollector.stats`, its `workers` views too) with
        this collector's frames and batches, and the server's (`server_stats()`)."""
        view = check_worker_view(workers)
        stats = self._inner.stats()
        elapsed = time.perf_counter() - self._start_time if self._start_time else 0.0
        stats.update(
            frames=self.frames,
            batches=self.iterations,
            completed=self.is_done,
            frames_per_second=self.frames / elapsed if elapsed > 0 else 0.0,
            policy_version=self.policy_version,
            server=self.server_stats(),
        )
        return worker_view(stats, stats["per_worker"], view)

    # --- background collection into a replay buffer ----------------------------------------

    def start(self) -> None:
        """The env workers extend the replay buffer in the background (see
        `MultiAsyncCollector.start`); the server serves them meanwhile."""
        self._check_open()
        if self._start_time is None:
            self._start_time = time.perf_counter()
        self._inner.start()

    @contextmanager
    def pause(self) -> Iterator[None]:
        """No worker collects while it is active."""
        with self._inner.pause():
            yield

    def async_shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop background collection (and with `close_env` everything: `state_dict()` and
        `stats()` then still answer with what the workers ended with, for a last
        checkpoint, as the other collectors' do)."""
        self._inner.async_shutdown(timeout, close_env=close_env)
        if close_env:
            self.shutdown()

    # --- shutdown ---------------------------------------------------------------------------

    def _shut_down(self, timeout: float | None, close_env: bool) -> None:
        """Stop the workers (a chunk in flight is abandoned), then the server, then remove the
        slots; bounded in time, idempotent."""
        inner = getattr(self, "_inner", None)
        if inner is not None:
            inner.shutdown(raise_on_error=False)
        self._finalizer()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_envs={self._num_envs}, num_workers={self.num_workers}, "
            f"server={self.server_backend!r}, frames_per_batch={self.frames_per_batch}, "
            f"total_frames={self.total_frames})"
        )

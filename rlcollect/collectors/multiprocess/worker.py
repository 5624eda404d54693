"""The worker side of the multi-process collectors: a collector served over a command pipe.

The process, its pipes and the message format are `rlcollect.runtime.processes`'s. A worker
builds its collector from a `WorkerSpec`, then answers one command at a time, so everything it
is told (new weights, a seed, a pause) happens between two batches. Batches never cross the
pipe: the worker copies each into a shared-memory TensorDict, whose handle the parent receives
once, with the first batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import multiprocessing
import multiprocessing.util
import os
import pickle
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
from tensordict import TensorDictBase

from rlcollect.collectors.children import env_attribute
from rlcollect.collectors.devices import finish_cuda_copies
from rlcollect.collectors.stacked_carrier import holds_stacked_steps
from rlcollect.envs.non_tensor import non_tensor_keys
from rlcollect.runtime.payload import WorkerPayload
from rlcollect.runtime.processes import HEADER, OK, command_describer, error_reply, serve_commands

# Reply to COLLECT: frames in the batch, the policy version that produced it, and whether the
# shared-memory handle follows (first batch only).
# frames, policy version, whether a pickled `(shared batch handle or None, non-tensor entries
# or None)` follows.
BATCH_REPLY = struct.Struct("<qq?")
SEED_REPLY = struct.Struct("<q")


class WorkerCommand(enum.IntEnum):
    """What the parent asks a collector worker to do; the header's argument is a seed, a
    policy version, or unused."""

    COLLECT = 1
    UPDATE_WEIGHTS = 2
    SEED = 3
    RESET = 4
    STATE_DICT = 5
    LOAD_STATE_DICT = 6
    START = 7
    PAUSE = 8
    RESUME = 9
    STOP = 10
    STATS = 11
    CLOSE = 12
    TRAJECTORY_IDS = 13
    PROFILE = 14
    GETATTR_ENV = 15
    UPDATE_MODELS = 16  # weights of models other than the policy, pickled
    MODEL_LAYOUT = 17  # names, shapes and dtypes of a model's weights
    REMOTE = 18  # get_distant_attr / map_fn on the worker's collector, pickled
    POLICY_LAYOUT = 19  # names, shapes and dtypes of the policy's weights
    WEIGHT_CHANNEL = 20  # the weight scheme's channel, laid out after start (pickled)
    # Never sent: what a worker answers first, once it has built its collector (awaited at
    # the first exchange when the pool does not wait for its workers to start).
    READY = 21


describe_command = command_describer(
    WorkerCommand,
    {
        WorkerCommand.SEED: "set_seed({argument})",
        WorkerCommand.UPDATE_WEIGHTS: "update_policy_weights_ (version {argument})",
    },
)


@dataclass
class WorkerSpec:
    """Everything a worker needs to build its collector; travels as a `WorkerPayload`
    (cloudpickle, so lambdas and closures work; multiprocessing's shared objects in an env
    maker are shared), apart from `shared`, which multiprocessing's pickler sends as handles.
    """

    collector_class: Callable[..., Any]
    create_env_fn: Any
    policy: Any
    policy_factory: Callable[[], Any] | None
    frames_per_batch: int
    total_frames: int
    collector_kwargs: dict[str, Any]
    trajectory_ids: tuple[int, int]
    index: int = 0
    scheme: Any = None
    version: int = 0
    weights: dict[str, Any] | None = None
    init_fn: Callable[[], None] | None = None  # TorchRL's: run first in the worker process
    models: dict[str, Any] = field(default_factory=dict)  # other models' weights, by model id
    shared: dict[str, Any] = field(default_factory=dict)

    def payload(self) -> WorkerPayload:
        """This spec packed for a worker's start, without `shared` (sent beside it). The env
        maker travels in a payload of its own, whose tensors in shared memory reach the worker
        shared (a TorchRL `EnvCreator`'s state, statistics its envs update together); the
        policy's are copied: a worker's policy changes only when weights are sent to it."""
        maker = WorkerPayload(self.create_env_fn, share_tensors=True)
        return WorkerPayload(dataclasses.replace(self, create_env_fn=maker, shared={}))

    def build(self) -> Any:
        """The collector, with its trajectory ids and the current weights (after `init_fn`).
        A single-process collector learns its index (`worker_idx`) and polls the parent's
        interruptor, when there is one (`preemptive_threshold`)."""
        if self.init_fn is not None:
            self.init_fn()
        policy = self.policy_factory() if self.policy_factory is not None else self.policy
        kwargs = dict(self.collector_kwargs)
        if _is_single_collector(self.collector_class):
            kwargs["worker_idx"] = self.index
            if self.shared.get("interruptor") is not None:
                kwargs["interruptor"] = self.shared["interruptor"]
        if self.shared.get("replay_buffer") is not None:
            kwargs["replay_buffer"] = self.shared["replay_buffer"]  # counts what it writes
        elif _is_single_collector(self.collector_class) and not _whole_episodes(kwargs):
            kwargs.setdefault("return_same_td", True)  # the worker copies it to shared memory
        collector = self.collector_class(
            self.create_env_fn,
            policy,
            frames_per_batch=self.frames_per_batch,
            total_frames=self.total_frames,
            **kwargs,
        )
        collector.assign_trajectory_ids(*self.trajectory_ids)
        if self.weights is not None:
            collector.apply_weights(self.weights, self.version)
        if self.models:
            collector.apply_model_weights(self.models)
        return collector


def _whole_episodes(options: dict[str, Any]) -> bool:
    """Whether the collector yields whole episodes (kept across batches, so never the same
    TensorDict twice)."""
    return (
        options.get("trajs_per_batch") is not None
        or options.get("batch_mode") == "complete_episodes"
    )


def _is_single_collector(collector_class: Any) -> bool:
    from rlcollect.collectors.single.collector import Collector

    target = getattr(collector_class, "func", collector_class)  # functools.partial
    return isinstance(target, type) and issubclass(target, Collector)


def run_collector_worker(
    index: int, connection: Connection, payload: WorkerPayload, shared: Any
) -> None:
    """Serve one collector (the target `bootstrap` runs): build it, report its batch size,
    answer commands until `CLOSE` or until the parent's pipe closes, then shut it down."""
    try:
        spec: WorkerSpec = payload.load()
        spec.shared = shared
        collector = spec.build()
        ready = {"frames_per_batch": collector.frames_per_batch}
    except BaseException as err:  # sys.exit() in a factory is reported like any error
        connection.send_bytes(error_reply(err, "building the collector"))
        return
    connection.send_bytes(OK + pickle.dumps(ready))
    server = CollectorServer(collector, spec.scheme, shared.get("weights"))
    try:
        server.serve(connection)
    finally:
        server.close()
    exit_at_once_when_spawned()


def exit_at_once_when_spawned() -> None:
    """End a spawned worker that closed cleanly as a forked one ends: with `os._exit` once
    multiprocessing's exit handlers have run, without tearing the interpreter down (torch's
    teardown takes seconds on a loaded machine, and a shutdown waits for it: a TorchRL
    launcher gives its node 10 s to shut down)."""
    if getattr(multiprocessing.current_process(), "_start_method", None) != "spawn":
        return
    multiprocessing.util._exit_function()  # what a forked worker runs before its os._exit
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class CollectorServer:
    """Answers a parent's commands with one collector."""

    def __init__(self, collector: Any, scheme: Any, weight_channel: Any) -> None:
        self.collector = collector
        self.scheme = scheme
        self.weight_channel = weight_channel
        self.out: TensorDictBase | None = None
        self.by_value: bool | None = None  # whether batches travel pickled (stacked steps)
        self.paused = contextlib.ExitStack()
        self.handlers: dict[int, Callable[[int, bytes], bytes]] = {
            WorkerCommand.COLLECT: self.collect,
            WorkerCommand.UPDATE_WEIGHTS: self.update_weights,
            WorkerCommand.SEED: self.set_seed,
            WorkerCommand.RESET: lambda *_: self.call(collector.reset),
            WorkerCommand.STATE_DICT: lambda *_: pickle.dumps(collector.state_dict()),
            WorkerCommand.LOAD_STATE_DICT: self.load_state_dict,
            WorkerCommand.START: self.start,
            WorkerCommand.PAUSE: lambda *_: self.call(self.paused.enter_context, collector.pause()),
            WorkerCommand.RESUME: lambda *_: self.call(self.paused.close),
            WorkerCommand.STOP: lambda *_: self.call(collector.async_shutdown, close_env=False),
            WorkerCommand.STATS: lambda *_: pickle.dumps(collector.stats()),
            WorkerCommand.TRAJECTORY_IDS: self.assign_trajectory_ids,
            WorkerCommand.PROFILE: self.profile,
            WorkerCommand.GETATTR_ENV: self.getattr_env,
            WorkerCommand.UPDATE_MODELS: self.update_models,
            WorkerCommand.MODEL_LAYOUT: self.model_layout,
            WorkerCommand.REMOTE: self.remote,
            WorkerCommand.POLICY_LAYOUT: self.policy_layout,
            WorkerCommand.WEIGHT_CHANNEL: self.set_weight_channel,
        }

    @staticmethod
    def call(function: Callable[..., Any], *args: Any, **kwargs: Any) -> bytes:
        function(*args, **kwargs)
        return b""

    def serve(self, connection: Connection) -> None:
        serve_commands(connection, self.handle, WorkerCommand.CLOSE, describe_command)

    def handle(self, command: int, argument: int, message: bytes) -> bytes:
        return self.handlers[command](argument, message[HEADER.size :])

    def collect(self, _: int, __: bytes) -> bytes:
        """One batch, copied into the shared-memory batch (made on the first call); a
        collector with a replay buffer extends it instead and only the count comes back.

        Non-tensor entries (strings a TorchRL transform writes) cannot live in shared
        memory: they travel pickled with the reply, as does the batch's handle, once."""
        batch = self.collector.next()
        version = int(getattr(self.collector, "policy_version", 0))
        if batch is None:
            return BATCH_REPLY.pack(self.collector.frames_per_batch, version, False)
        if self.by_value is None:  # a collector's batches keep their kind
            self.by_value = holds_stacked_steps(batch)
        if self.by_value:
            # Stacked steps (heterogeneous or dynamic specs) fit no preallocated buffer:
            # each batch travels pickled, by value.
            frames = batch.numel() * int(getattr(self.collector, "frames_per_step", 1))
            return BATCH_REPLY.pack(frames, version, True) + pickle.dumps((batch, None))
        extra_keys = non_tensor_keys(batch)
        extras = {key: batch.get(key) for key in extra_keys} or None
        tensors = batch.exclude(*extra_keys) if extra_keys else batch
        # A new shared batch when the shape changes (batches of whole episodes vary).
        first = self.out is None or self.out.batch_size != tensors.batch_size
        if self.out is None or first:
            self.out = tensors.clone().share_memory_()
        else:
            self.out.update_(tensors)
        # A batch on CUDA reaches the parent through CUDA IPC, outside this stream's order.
        finish_cuda_copies(self.out)
        with_payload = first or extras is not None
        frames = batch.numel() * int(getattr(self.collector, "frames_per_step", 1))
        reply = BATCH_REPLY.pack(frames, version, with_payload)
        if with_payload:
            reply += bytes(ForkingPickler.dumps((self.out if first else None, extras)))
        return reply

    def profile(self, _: int, payload: bytes) -> bytes:
        """Start profiling with the pickled `ProfileConfig`, or stop with an empty payload."""
        if payload:
            self.collector.profile_with(pickle.loads(payload))
        else:
            self.collector.disable_profile()
        return b""

    def update_weights(self, version: int, payload: bytes) -> bytes:
        timeout, scheme_payload = pickle.loads(payload)
        weights = self.scheme.unpack(self.weight_channel, scheme_payload)
        if weights is not None:
            self.collector.apply_weights(weights, version, timeout)
        return b""

    def update_models(self, _: int, payload: bytes) -> bytes:
        """Load other models' weights (checked by the parent), then acknowledge."""
        timeout, models = pickle.loads(payload)
        self.collector.apply_model_weights(models, timeout)
        return b""

    def model_layout(self, _: int, payload: bytes) -> bytes:
        """A model's weights layout, or the error naming why the model id names none
        (answered, not raised: a wrong model id leaves the worker as it was)."""
        try:
            return pickle.dumps((True, self.collector.model_layout(payload.decode())))
        except (KeyError, TypeError, ValueError) as err:
            return pickle.dumps((False, err))

    def policy_layout(self, _: int, __: bytes) -> bytes:
        """The policy's weights layout, as built here (from a factory: the parent has none)."""
        return pickle.dumps(self.collector.policy_layout())

    def set_weight_channel(self, _: int, payload: bytes) -> bytes:
        """Take the weight scheme's channel (a shared copy the parent laid out at its first
        update, when only the workers built the policy)."""
        self.weight_channel = pickle.loads(payload)
        return b""

    def set_seed(self, seed: int, _: bytes) -> bytes:
        """Seed the env and this process's torch generator (random actions, a stochastic
        policy's draws): each worker gets its own seed, so they differ and replay alike."""
        torch.manual_seed(seed)
        return SEED_REPLY.pack(self.collector.set_seed(seed))

    def start(self, frames: int, _: bytes) -> bytes:
        """Fill the replay buffer in the background; `frames` > 0 caps this worker's total
        (its share of the parent's `total_frames`), counted from what it has collected."""
        if frames > 0:
            self.collector.total_frames = self.collector.frames + frames
        self.collector.start()
        return b""

    def getattr_env(self, _: int, payload: bytes) -> bytes:
        """An attribute of the collector's env, as `env_attribute` answers it (a value that
        cannot be pickled is answered as such: the worker goes on)."""
        answer = env_attribute(self.collector, payload.decode())
        try:
            return pickle.dumps(answer)
        except Exception as err:  # any pickling failure is answered, not raised
            why = f"a {type(answer[1]).__name__} cannot be sent back from the worker ({err})"
            return pickle.dumps((None, why))

    def remote(self, _: int, payload: bytes) -> bytes:
        """TorchRL's remote helpers on this worker's collector: `("get", path)` answers
        `get_distant_attr(path)`, `("call", path, args, kwargs)` calls what `path` names,
        `("set", name, value)` sets the collector's attribute (its collect hooks)."""
        kind, path, *call = pickle.loads(payload)
        if kind == "get":
            return pickle.dumps(self.collector.get_distant_attr(path))
        if kind == "set":
            setattr(self.collector, path, *call)
            return b""
        args, kwargs = call
        return pickle.dumps(self.collector.map_fn(path, [args], [kwargs])[0])

    def assign_trajectory_ids(self, _: int, payload: bytes) -> bytes:
        self.collector.assign_trajectory_ids(*pickle.loads(payload))
        return b""

    def load_state_dict(self, _: int, payload: bytes) -> bytes:
        self.collector.load_state_dict(pickle.loads(payload))
        return b""

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.paused.close()
        self.collector.shutdown()

"""A TorchRL replay buffer handed to the workers: shared, and its lazy storage laid out first.

TorchRL's buffers travel to worker processes when those start, and a lazy storage
(`LazyTensorStorage`, `LazyMemmapStorage`) refuses to travel before it holds data: a worker
would allocate a storage of its own that nobody else sees. TorchRL's multi-process collectors
therefore write one batch's worth of zeros laid out as the workers' batches will be, then empty
the buffer (or let the workers allocate it when the storage was built with `shared_init=True`),
and share a buffer that is not shared yet. This module does the same, with the layout taken from
a real batch: one step of worker 0's own collector, built here, so the keys, shapes and dtypes
are exactly those the workers write. Our own buffers (`rlcollect.replay`) need none of it.
"""

from __future__ import annotations

import math
import multiprocessing
import warnings
from dataclasses import replace
from typing import Any

from tensordict import TensorDictBase

from rlcollect.collectors.children import episode_layout
from rlcollect.collectors.multiprocess.worker import WorkerSpec


def is_torchrl_buffer(buffer: Any) -> bool:
    """Whether `buffer` is one of TorchRL's replay buffers (or a subclass of one)."""
    return any(cls.__module__.split(".")[0] == "torchrl" for cls in type(buffer).__mro__)


def prepare_shared_buffer(buffer: Any, spec: WorkerSpec) -> None:
    """Make a TorchRL `buffer` fit to be written by the workers, as TorchRL's collectors do:
    shared (TorchRL's `share()`), and with a lazy storage laid out from a prototype batch of
    `spec`'s collector, then emptied (`write_count` back to 0). A storage built with
    `shared_init=True`, or one whose workers alone build the policy (a factory, no policy
    here) and that can be laid out by them, is left for the first worker to lay out.
    Anything else: untouched."""
    if buffer is None or not is_torchrl_buffer(buffer):
        return
    if not getattr(buffer, "shared", True):
        buffer.share()
    storage = getattr(buffer, "_storage", None)
    if getattr(storage, "initialized", True) or getattr(storage, "shared_init", False):
        return
    if spec.policy is None and spec.policy_factory is not None and lays_itself_out(storage):
        return  # a prototype would build the policy here: the first worker lays it out
    prototype = prototype_batch(spec)
    if spec.collector_kwargs.get("extend_buffer", True):
        buffer.extend(prototype)
    else:  # the workers add step by step: so does the layout
        buffer.add(prototype[..., 0])
    buffer.empty()


def lays_itself_out(storage: Any) -> bool:
    """Turn on the shared-init mode of a TorchRL lazy storage, in which the first process to
    write lays the storage out (in files every process maps) while the others wait, as
    TorchRL's collectors do when the policy exists only in their workers. False when the
    storage has no such mode (it is then laid out here from a prototype batch)."""
    if not (hasattr(storage, "shared_init") and hasattr(storage, "_make_init_directory")):
        return False
    if getattr(storage, "_compilable", False):
        return False
    storage.shared_init = True
    storage._init_lock = multiprocessing.Lock()
    storage._init_event = multiprocessing.Event()
    storage._make_init_directory()
    return True


WHOLE_EPISODE_OPTIONS = ("trajs_per_batch", "traj_format", "trajs_per_write", "batch_mode")


def prototype_batch(spec: WorkerSpec) -> TensorDictBase:
    """Zeros laid out as one batch that `spec`'s collector writes to a replay buffer: one step
    of that collector (built here, with its env, policy and options, and shut down), repeated
    along time to the worker's batch length, without dim names (TorchRL's storages take none).
    A worker that writes whole episodes (`trajs_per_batch`, `batch_mode="complete_episodes"`)
    writes them flat, one dim whatever its env's batch shape: so is its prototype.
    """
    options = dict(spec.collector_kwargs)
    options["init_random_frames"] = None  # the layout of a policy step
    flat = episode_layout(options) is not None  # whole episodes reach a buffer flat
    for name in WHOLE_EPISODE_OPTIONS:
        options.pop(name, None)  # one plain step, whatever the worker batches
    probe = replace(
        spec,
        frames_per_batch=1,
        collector_kwargs=options,
        weights=None,
        init_fn=None,
        shared={},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one frame rounds up to one step of a batched env
        collector = probe.build()
    try:
        step = collector.next()
    finally:
        collector.shutdown()
    if flat:
        step = step.reshape(-1)
    envs = step.batch_size[:-1].numel()
    steps = math.ceil(spec.frames_per_batch / envs)
    batch = step[..., :1].expand(*step.batch_size[:-1], steps).clone().zero_()
    batch.names = None
    return batch

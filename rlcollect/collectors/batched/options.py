"""`AsyncBatchedCollector`'s TorchRL arguments, checked and turned into what the room uses.

TorchRL's structured configs (`InferenceServerConfig`, `InferenceDeviceConfig`) are read by
attribute, so TorchRL's own objects (or any with those attributes) work without importing
TorchRL here.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from rlcollect.collectors.batched.serving import Batching
from rlcollect.collectors.devices import parse_device
from rlcollect.collectors.options import check_int, round_to_batches, validate_frames
from rlcollect.envs.serial import env_factories

ENV_BACKENDS = ("threading", "multiprocessing")
SERVER_BACKENDS = ("thread", "process")
ENV_EXCHANGES = ("queue", "shm", "auto")
TRANSPORTS = ("auto", "driver", "thread", "process", "shm", None)
# Consecutive steps a worker sends at once at least, with transition_chunk_size="auto".
AUTO_CHUNK = 64

ServerBackend = Literal["thread", "process"]


def check_policy_source(policy: Any, policy_factory: Any) -> None:
    """Exactly one of `policy` and `policy_factory` (TorchRL's messages).

    Raises:
        TypeError: both, or neither.
    """
    if policy is not None and policy_factory is not None:
        raise TypeError(
            "policy and policy_factory are mutually exclusive; pass the policy, or a "
            "factory that builds it where it is served."
        )
    if policy is None and policy_factory is None:
        raise TypeError(
            "one of policy or policy_factory must be provided: the inference server needs a "
            "policy to serve."
        )
    if policy_factory is not None and not callable(policy_factory):
        raise TypeError(f"policy_factory must be callable; got {policy_factory!r}.")


def batching_from(
    server_config: Any,
    max_batch_size: Any,
    min_batch_size: Any,
    server_timeout: Any,
    concurrent_forwards: Any = 1,
) -> tuple[Batching, ServerBackend]:
    """The batch bounds and the server backend, from `server_config` or the loose arguments;
    `concurrent_forwards` (ours, not in TorchRL's config) goes with either.

    Raises:
        ValueError: `server_config` with a loose argument, bounds that are not positive or
            a minimum above the maximum, fewer than one concurrent forward, or an unknown
            backend.
    """
    loose = {
        "max_batch_size": max_batch_size,
        "min_batch_size": min_batch_size,
        "server_timeout": server_timeout,
    }
    backend = "thread"
    if server_config is not None:
        given = sorted(name for name, value in loose.items() if value is not None)
        if given:
            raise ValueError(
                f"server_config is mutually exclusive with {given}; set them in the config."
            )
        backend = getattr(server_config, "service_backend", "thread")
        max_batch_size = getattr(server_config, "max_batch_size", None)
        min_batch_size = getattr(server_config, "min_batch_size", None)
        server_timeout = getattr(server_config, "timeout", None)
    if backend not in SERVER_BACKENDS:
        raise ValueError(
            f"the inference server's service_backend={backend!r} is not supported; use one of "
            f"{SERVER_BACKENDS} (Ray actors serve through RayCollector instead)."
        )
    batching = Batching(
        max_batch_size=check_int(
            "max_batch_size", 64 if max_batch_size is None else max_batch_size
        ),
        min_batch_size=check_int("min_batch_size", 1 if min_batch_size is None else min_batch_size),
        timeout=float(0.01 if server_timeout is None else server_timeout),
        concurrent_forwards=check_int("concurrent_forwards", concurrent_forwards),
    )
    if batching.concurrent_forwards < 1:
        raise ValueError(
            f"concurrent_forwards={batching.concurrent_forwards} must be at least 1 (one "
            "forward at a time is the default; more run that many forwards at once)."
        )
    if batching.max_batch_size < 1 or batching.min_batch_size < 1:
        raise ValueError(
            f"max_batch_size={batching.max_batch_size} and min_batch_size="
            f"{batching.min_batch_size} must be at least 1."
        )
    if batching.min_batch_size > batching.max_batch_size:
        raise ValueError(
            f"min_batch_size={batching.min_batch_size} is above max_batch_size="
            f"{batching.max_batch_size}; lower it, or raise max_batch_size."
        )
    if batching.timeout < 0:
        raise ValueError(f"server_timeout={batching.timeout} must be >= 0 seconds.")
    return batching, backend  # type: ignore[return-value]


@dataclass(frozen=True)
class Devices:
    """Where the policy runs; envs and batches stay on the CPU."""

    policy_device: torch.device | None


def devices_from(device: Any, device_config: Any) -> Devices:
    """The policy's device from `device` or `device_config` (TorchRL's rules: one of them).

    Raises:
        ValueError: both given, or an env / output / storing device other than the CPU.
    """
    if device_config is None:
        return Devices(parse_device(device, "device"))
    if device is not None:
        raise ValueError("device and device_config are mutually exclusive; pass one.")
    for name in ("output_device", "env_device", "storing_device"):
        value = parse_device(getattr(device_config, name, None), f"device_config.{name}")
        if value is not None and value.type != "cpu":
            raise ValueError(
                f"device_config.{name}={value} is not supported: env workers and batches live "
                "in shared CPU memory here. Leave it unset or 'cpu', and move batches yourself."
            )
    return Devices(parse_device(getattr(device_config, "policy_device", None), "policy_device"))


def env_backend_from(backend: Any, env_backend: Any, policy_backend: Any) -> str:
    """The env backend asked for; both run worker processes here (see the guide).

    Raises:
        ValueError: an unknown backend, or a policy backend other than threads/processes.
    """
    chosen = env_backend if env_backend is not None else backend
    chosen = "multiprocessing" if chosen is None else chosen
    if chosen not in ENV_BACKENDS:
        raise ValueError(f"env_backend={chosen!r} is not supported; use one of {ENV_BACKENDS}.")
    chosen_policy = policy_backend if policy_backend is not None else backend
    if chosen_policy not in (None, "threading", "multiprocessing"):
        raise ValueError(
            f"policy_backend={chosen_policy!r} is not supported; use 'threading' or "
            "'multiprocessing' (Ray-served policies: use RayCollector)."
        )
    return str(chosen)


def check_exchange(env_exchange: Any, transport: Any) -> None:
    """`env_exchange` and `transport` are TorchRL's names; every choice here is shared
    memory slots written in place, so they are checked and have no other effect.

    Raises:
        ValueError: an unknown value.
    """
    if env_exchange not in ENV_EXCHANGES:
        raise ValueError(
            f"env_exchange={env_exchange!r} is not supported; use one of {ENV_EXCHANGES}."
        )
    if not (transport in TRANSPORTS or hasattr(transport, "client")):
        raise ValueError(
            f"transport={transport!r} is not supported; use 'auto' (shared-memory slots, "
            "always used here) or None."
        )


def check_unsupported(worker_affinity: Any, driver_affinity: Any, model_id: Any) -> None:
    """Refuse what is not offered: CPU affinities, a model other than the policy.

    Raises:
        ValueError: naming the argument and what to do instead.
    """
    if worker_affinity is not None or driver_affinity is not None:
        raise ValueError(
            "worker_affinity and driver_affinity are not supported; pin processes with "
            "taskset or os.sched_setaffinity in the env maker instead."
        )
    if model_id != "policy":
        raise ValueError(
            f"weight_sync_model_id={model_id!r}: the server serves one model, 'policy'."
        )


def env_makers(create_env_fn: Any, create_env_kwargs: Any) -> list[Callable[[], Any]]:
    """One zero-argument maker per env (Gymnasium ids and envs wrapped, kwargs bound).

    Raises:
        TypeError: `create_env_fn` is not a non-empty list.
        ValueError: a list of kwargs of another length.
    """
    if (
        not isinstance(create_env_fn, Sequence)
        or isinstance(create_env_fn, str)
        or not create_env_fn
    ):
        raise TypeError(
            "create_env_fn must be a non-empty list of env makers, one per env, e.g. "
            "[make_env] * 8."
        )
    return env_factories(len(create_env_fn), list(create_env_fn), create_env_kwargs)


def chunk_size_from(
    transition_chunk_size: Any, frames_per_batch: int, num_envs: int, envs_per_worker: int
) -> int:
    """Consecutive steps per env in one worker message: an int, or "auto" (at least 64, one
    batch's share per env when larger, never more than a batch)."""
    if transition_chunk_size == "auto":
        share = frames_per_batch // num_envs
        return max(1, min(max(AUTO_CHUNK, share), frames_per_batch // envs_per_worker))
    size = check_int("transition_chunk_size", transition_chunk_size)
    if size < 1:
        raise ValueError(f"transition_chunk_size={size} must be at least 1 (or 'auto').")
    return size


def batch_rows(frames_per_batch: int, chunk: int, envs_per_worker: int) -> int:
    """Chunks gathered per batch, rounding `frames_per_batch` up to whole chunks (warned)."""
    per_chunk = chunk * envs_per_worker
    chunks = math.ceil(frames_per_batch / per_chunk)
    if chunks * per_chunk != frames_per_batch:
        warnings.warn(
            f"frames_per_batch={frames_per_batch} is not a multiple of a worker's chunk of "
            f"{per_chunk} frames ({envs_per_worker} env(s) x transition_chunk_size={chunk}); "
            f"each batch holds {chunks * per_chunk} frames.",
            stacklevel=4,
        )
    return chunks


@dataclass(frozen=True)
class Sizes:
    """How many envs, workers, steps per chunk and chunks per batch; frames per batch and in
    all, rounded up to whole chunks and batches (with warnings)."""

    num_envs: int
    envs_per_worker: int
    num_workers: int
    chunk_size: int
    chunks_per_batch: int
    requested_frames: int
    frames_per_batch: int
    total_frames: int

    @classmethod
    def of(
        cls,
        num_envs: int,
        envs_per_worker: Any,
        transition_chunk_size: Any,
        frames_per_batch: Any,
        total_frames: Any,
        whole_trajectories: bool = False,
    ) -> Sizes:
        """The sizes; with `whole_trajectories`, `frames_per_batch` is a minimum and nothing is
        rounded.

        Raises:
            ValueError: `envs_per_worker` that does not divide the envs, or bad frame counts.
        """
        per_worker = check_int("envs_per_worker", envs_per_worker)
        if per_worker < 1 or num_envs % per_worker:
            raise ValueError(
                f"envs_per_worker={per_worker} must be a positive divisor of the {num_envs} "
                "envs of create_env_fn."
            )
        requested, total = validate_frames(frames_per_batch, total_frames)
        chunk = chunk_size_from(transition_chunk_size, requested, num_envs, per_worker)
        chunks = 1 if whole_trajectories else batch_rows(requested, chunk, per_worker)
        frames = requested if whole_trajectories else chunks * chunk * per_worker
        return cls(
            num_envs=num_envs,
            envs_per_worker=per_worker,
            num_workers=num_envs // per_worker,
            chunk_size=chunk,
            chunks_per_batch=chunks,
            requested_frames=requested,
            frames_per_batch=frames,
            total_frames=total
            if whole_trajectories
            else round_to_batches("total_frames", total, frames, 3),
        )

"""The arguments of `RayCollector`, checked before Ray starts: actors, options, resources."""

from __future__ import annotations

import math
import numbers
import uuid
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from rlcollect.collectors.base import CollectorBase
from rlcollect.collectors.children import (
    check_options,
    episode_layout,
    per_child_factories,
    resolve_children,
)
from rlcollect.collectors.options import check_int, validate_frames
from rlcollect.collectors.ray.actor import ActorSpec
from rlcollect.collectors.weights.ray_scheme import RayWeightSyncScheme
from rlcollect.collectors.weights.schemes import (
    POLICY_MODEL_ID,
    NoWeightSyncScheme,
    WeightSyncScheme,
    check_schemes,
)
from rlcollect.runtime.fan_out import is_sequence
from rlcollect.runtime.ray_lease import plain

# The `ray.remote` options RayCollector sets itself: restarts follow `restart_dead_collectors`,
# and each actor answers one call at a time. Every other option is Ray's to judge.
OWN_REMOTE_OPTIONS = {
    "max_restarts": "set by restart_dead_collectors",
    "max_task_retries": "set by restart_dead_collectors",
    "max_concurrency": "each actor answers one call at a time",
    "concurrency_groups": "each actor answers one call at a time",
    "allow_out_of_order_execution": "each actor answers one call at a time",
}
DEFAULT_REMOTE_CONFIG: dict[str, Any] = {"num_cpus": 1}


def per_actor_frames(frames_per_batch: Any, num_collectors: int, sync: bool) -> int:
    """Frames each actor collects per batch: a share of the gathered batch (`sync=True`,
    rounded up with a warning), or the whole of every batch it yields (`sync=False`)."""
    if isinstance(frames_per_batch, bool) or not isinstance(frames_per_batch, numbers.Integral):
        raise TypeError(
            f"frames_per_batch must be an int; got {frames_per_batch!r} "
            f"({type(frames_per_batch).__name__})."
        )
    frames, _ = validate_frames(frames_per_batch, -1)
    if not sync:
        return frames
    each = math.ceil(frames / num_collectors)
    if each * num_collectors != frames:
        warnings.warn(
            f"frames_per_batch={frames} is not a multiple of num_collectors={num_collectors}; "
            f"each actor collects {each} frames ({each * num_collectors} a batch).",
            stacklevel=4,
        )
    return each


def check_collector_class(collector_class: Any) -> None:
    """`collector_class` must build a `Collector` or a multi-process collector."""
    target = getattr(collector_class, "func", collector_class)  # functools.partial
    if not (isinstance(target, type) and issubclass(target, CollectorBase)):
        raise TypeError(
            f"collector_class={collector_class!r} is not a collector class; use Collector, "
            "MultiSyncCollector, MultiAsyncCollector, or a functools.partial of one (e.g. "
            "partial(MultiSyncCollector, num_workers=2))."
        )


def check_workers_per_actor(collector_class: Any, num_workers_per_collector: Any) -> int:
    """TorchRL's `num_workers_per_collector`: how many workers (copies of its env maker)
    each actor's multi-process collector runs; 1 for a `Collector`, which runs one env.

    Raises:
        TypeError: not an int.
        ValueError: below 1, or above 1 with a collector class that runs one env.
    """
    count = check_int("num_workers_per_collector", num_workers_per_collector)
    if count < 1:
        raise ValueError(f"num_workers_per_collector={count} must be at least 1.")
    if count > 1 and not _takes_maker_list(collector_class):
        raise ValueError(
            f"num_workers_per_collector={count} needs a multi-process collector_class "
            f"(MultiSyncCollector, MultiAsyncCollector); {_class_name(collector_class)} runs "
            "one env per actor. Use num_collectors for more actors instead."
        )
    return count


def actor_env_maker(
    collector_class: Any, maker: Any, options: Mapping[str, Any], workers: int
) -> Any:
    """What one actor's collector is built from: a class that runs workers of its own gets
    `workers` copies of the maker (one per worker, as TorchRL's RayCollector hands them),
    unless its `num_workers` is given (in a `functools.partial` or the collector options:
    it then copies the maker itself); a `Collector` gets the maker."""
    given = {**getattr(collector_class, "keywords", {}), **options}
    if not _takes_maker_list(collector_class) or is_sequence(maker):
        return maker
    if given.get("num_workers") is not None:
        if workers > 1 and given["num_workers"] != workers:
            raise ValueError(
                f"num_workers={given['num_workers']} (for collector_class) and "
                f"num_workers_per_collector={workers} disagree; give one of them."
            )
        return maker
    return [maker] * workers


def _takes_maker_list(collector_class: Any) -> bool:
    target = getattr(collector_class, "func", collector_class)  # functools.partial
    return bool(getattr(target, "takes_env_maker_list", False))


def _class_name(collector_class: Any) -> str:
    target = getattr(collector_class, "func", collector_class)
    return getattr(target, "__name__", repr(target))


def per_actor_options(
    collector_class: Any,
    collector_kwargs: Any,
    options: Mapping[str, Any],
    num_collectors: int,
) -> list[dict[str, Any]]:
    """Each actor's collector options: the shared `options`, plus its own `collector_kwargs`
    (one dict for all, or one per actor), checked against `collector_class`."""
    if collector_kwargs is None:
        own: list[Any] = [{}] * num_collectors
    elif isinstance(collector_kwargs, Mapping):
        own = [collector_kwargs] * num_collectors
    elif is_sequence(collector_kwargs) and len(collector_kwargs) == num_collectors:
        own = list(collector_kwargs)
    else:
        raise TypeError(
            "collector_kwargs must be a dict of collector options, or a list of "
            f"{num_collectors} dicts (one per actor); got {collector_kwargs!r}."
        )
    merged = []
    for index, kwargs in enumerate(own):
        if not isinstance(kwargs, Mapping):
            raise TypeError(f"collector_kwargs[{index}] must be a dict; got {kwargs!r}.")
        both = sorted(set(kwargs) & set(options))
        if both:
            raise ValueError(
                f"{both} given both as RayCollector arguments and in collector_kwargs; "
                "give each option once."
            )
        combined = {**options, **plain(kwargs)}
        check_options(collector_class, combined)
        merged.append(combined)
    return merged


def check_remote_configs(remote_configs: Any, num_collectors: int) -> list[dict[str, Any]]:
    """One `ray.remote` option dict per actor (default `{"num_cpus": 1}`)."""
    if remote_configs is None:
        configs: list[Any] = [DEFAULT_REMOTE_CONFIG] * num_collectors
    elif isinstance(remote_configs, Mapping):
        configs = [remote_configs] * num_collectors
    elif is_sequence(remote_configs) and len(remote_configs) == num_collectors:
        configs = list(remote_configs)
    else:
        raise TypeError(
            "remote_configs must be a dict of ray.remote options (e.g. {'num_cpus': 1, "
            f"'num_gpus': 0.5}}), or a list of {num_collectors} dicts (one per actor); got "
            f"{remote_configs!r}."
        )
    checked = []
    for index, config in enumerate(configs):
        if not isinstance(config, Mapping):
            raise TypeError(f"remote_configs[{index}] must be a dict; got {config!r}.")
        for name in config:
            if name in OWN_REMOTE_OPTIONS:
                raise ValueError(
                    f"remote_configs[{index}] has {name!r}: RayCollector sets it "
                    f"({OWN_REMOTE_OPTIONS[name]})."
                )
        _let_ray_judge(config, index)
        checked.append(dict(plain(config)))
    return checked


def _let_ray_judge(config: Mapping[str, Any], index: int) -> None:
    """Ray's own check of actor options (names and values), which needs no running Ray: an
    option Ray adds is taken as soon as Ray takes it."""
    import ray

    try:
        ray.remote(_OptionsProbe).options(**config)
    except (ValueError, TypeError) as err:
        raise type(err)(f"remote_configs[{index}]: {err}") from None


class _OptionsProbe:
    """An actor class that is never created: Ray checks `remote_configs` against it."""


def served_buffer_client(replay_buffer: Any) -> Any:
    """The picklable client that actors extend, for a buffer served by Ray (ours, or any
    with TorchRL's `service_backend == "ray"` and `client()`); None for no buffer."""
    if replay_buffer is None:
        return None
    if getattr(replay_buffer, "service_backend", None) == "ray" and callable(
        getattr(replay_buffer, "client", None)
    ):
        return replay_buffer.client()
    raise TypeError(
        f"replay_buffer must be served by Ray so that remote actors can extend it; got a "
        f"{type(replay_buffer).__name__}. Use rlcollect.replay.RayReplayBuffer(storage=..., "
        "sampler=...) with the same arguments."
    )


def choose_scheme(weight_sync_schemes: Mapping[str, Any] | None) -> WeightSyncScheme:
    """The policy's scheme: `RayWeightSyncScheme` (default) or `NoWeightSyncScheme`."""
    chosen = check_schemes("weight_sync_schemes", weight_sync_schemes).get(POLICY_MODEL_ID)
    if chosen is None:
        return RayWeightSyncScheme()
    if not isinstance(chosen, RayWeightSyncScheme | NoWeightSyncScheme):
        raise TypeError(
            f"weight_sync_schemes['policy'] is a {type(chosen).__name__}; RayCollector sends "
            "weights through Ray's object store: use RayWeightSyncScheme() (or "
            "NoWeightSyncScheme() to keep the actors' weights)."
        )
    return chosen


def check_flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False; got {value!r}.")
    return value


def check_interval(max_weight_update_interval: Any) -> int:
    """Batches an actor may collect before its weights are refreshed (-1: never forced)."""
    value = check_int("max_weight_update_interval", max_weight_update_interval)
    if value < -1:
        raise ValueError(
            f"max_weight_update_interval={value} must be -1 (no forced update) or a number of "
            "batches >= 0."
        )
    return value


def check_timeout(name: str, value: Any, allow_none: bool) -> float | None:
    if value is None and allow_none:
        return None
    is_number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not is_number or not value > 0:
        none = ", or None to wait forever" if allow_none else ""
        raise ValueError(f"{name}={value!r} must be a positive number of seconds{none}.")
    return float(value)


def plan_actors(
    create_env_fn: Any,
    *,
    num_collectors: Any,
    frames_per_batch: Any,
    sync: bool,
    collector_class: Any,
    collector_kwargs: Any,
    remote_configs: Any,
    policy: Any,
    policy_factory: Any,
    replay_buffer: Any,
    init_random_frames: Any,
    options: Mapping[str, Any],
    num_workers_per_collector: Any = 1,
) -> tuple[list[ActorSpec], list[dict[str, Any]]]:
    """What every actor builds and the `ray.remote` options it runs with, every argument
    checked (the first wrong one raises, naming it). `options` are the collector options of
    all actors; `init_random_frames` is shared out among them; actor i draws trajectory ids
    `i + k N`; a replay buffer reaches them as its client; a multi-process collector class
    gets `num_workers_per_collector` copies of its actor's env maker."""
    makers, num = resolve_children(create_env_fn, num_collectors, "num_collectors", "actor")
    frames_each = per_actor_frames(frames_per_batch, num, sync)
    check_collector_class(collector_class)
    workers = check_workers_per_actor(collector_class, num_workers_per_collector)
    factories = per_child_factories(policy, policy_factory, num, "actor")
    client = served_buffer_client(replay_buffer)
    shared = dict(options)
    if init_random_frames:  # shared out, as a multi-process collector does
        shared["init_random_frames"] = -(-int(init_random_frames) // num)
    actor_options = per_actor_options(collector_class, collector_kwargs, shared, num)
    for kwargs in actor_options:
        if client is not None and kwargs.get("trajs_per_write") is not None:
            # The actor's collector writes its episodes, `trajs_per_write` at a time.
            kwargs["replay_buffer"] = client
    configs = check_remote_configs(remote_configs, num)
    writer = f"rlcollect-collector-{uuid.uuid4().hex[:12]}"  # its actors' writes, by name
    specs = [
        ActorSpec(
            collector_class=collector_class,
            create_env_fn=actor_env_maker(collector_class, maker, actor_options[index], workers),
            policy_factory=factories[index],
            frames_per_batch=frames_each,
            collector_kwargs=actor_options[index],
            trajectory_ids=(index, num),
            index=index,
            replay_buffer=client,
            writer=writer,
        )
        for index, maker in enumerate(makers)
    ]
    return specs, configs


def actor_episode_layout(specs: Sequence[ActorSpec], sync: bool) -> str | None:
    """How the actors lay out their batches of whole episodes ("cat": flat, "padded":
    `[N, max_len]`), or None for fixed-size batches; with `sync=True` every actor must agree,
    since one batch of each is gathered into one."""
    layouts = [
        episode_layout({**getattr(spec.collector_class, "keywords", {}), **spec.collector_kwargs})
        for spec in specs
    ]
    if sync and len(set(layouts)) > 1:
        described = [layout or "fixed-size" for layout in layouts]
        raise ValueError(
            f"sync=True gathers one batch of every actor into one, but the actors' options "
            f"give batches of different layouts ({described}, actor by actor); give every "
            "actor the same batch_mode, trajs_per_batch and traj_format, or use sync=False."
        )
    return layouts[0]

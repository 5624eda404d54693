"""What every collector with children shares, whether they run in worker processes or in Ray
actors: one value or one per child, the children's options and seeds checked, their episode
statistics merged, their batches gathered, and the gap between a restarted child's trajectory
ids and its predecessor's.

Both `multiprocess/` and `ray/` import this room; neither imports the other.
"""

from __future__ import annotations

import difflib
import inspect
import numbers
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, cast, get_args

import torch
from tensordict import TensorDictBase, pad

from rlcollect import keys
from rlcollect.collectors.base import COLLECTOR_SHORTHANDS, CollectorBase
from rlcollect.collectors.bookkeeping import RECENT_EPISODES
from rlcollect.collectors.options import check_int
from rlcollect.errors import MisuseError
from rlcollect.runtime.fan_out import is_sequence, per_child

# A restarted child draws trajectory ids this many strides past its predecessor's, so that no
# id of the dead child's trajectories is ever reused.
RESTART_ID_GAP = 2**32

CatResults = Literal["stack", 0, -1]
CAT_RESULTS = ("stack", 0, -1)


def resolve_children(
    create_env_fn: Any, count: Any, count_name: str, child: str
) -> tuple[list[Any], int]:
    """One env maker per child, from a list of them or from one maker and `count`.

    Raises:
        ValueError: an empty list, a count that disagrees with the list, or no count for one
            maker, naming `count_name` (e.g. `num_workers`).
    """
    if is_sequence(create_env_fn):
        makers = list(create_env_fn)
        if not makers:
            raise ValueError(f"create_env_fn is an empty list; give one env maker per {child}.")
        if count is not None and count != len(makers):
            raise ValueError(
                f"{count_name}={count!r} but create_env_fn lists {len(makers)} env makers "
                f"(one per {child}); drop {count_name} or make them agree."
            )
        return makers, len(makers)
    if count is None:
        raise ValueError(
            f"{count_name} is needed when create_env_fn is a single env maker, e.g. "
            f"{count_name}=2 (or pass a list with one env maker per {child})."
        )
    count = check_int(count_name, count)
    if count < 1:
        raise ValueError(f"{count_name}={count} must be at least 1.")
    return [create_env_fn] * count, count


def per_child_factories(
    policy: Any, policy_factory: Any, count: int, child: str, allow_both: bool = False
) -> list[Callable[[], Any] | None]:
    """One policy factory per child (or Nones), refusing a policy and a factory together
    unless `allow_both` (then the policy is where the weights the children get are read)."""
    if policy is not None and policy_factory is not None and not allow_both:
        raise ValueError("pass policy or policy_factory, not both.")
    factories = per_child("policy_factory", policy_factory, count, f"num_{child}s", child)
    for factory in factories:
        if factory is not None and not callable(factory):
            raise TypeError(
                f"policy_factory must be a callable returning a policy (or one per {child}); "
                f"got {factory!r}."
            )
    return factories


def accepted_options(collector_class: Any) -> set[str] | None:
    """The keyword arguments `collector_class` takes (None: it takes any); a class's are its
    `__init__`'s (`Collector.__new__` takes any: it is the front door)."""
    target = getattr(collector_class, "func", collector_class)
    if isinstance(target, type):
        target = target.__init__  # type: ignore[misc]
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters}


def collector_class_of(collector_class: Any) -> Any:
    """`collector_class` as a class: None (what TorchRL's Hydra collector configs pass) is the
    default `Collector`, and TorchRL's strings "single", "sync" and "async" stand for
    `Collector`, `MultiSyncCollector` and `MultiAsyncCollector` (each class registers its
    own, see `CollectorBase`); anything else is kept.

    Raises:
        ValueError: another string, naming the shorthands.
    """
    if collector_class is None:
        return COLLECTOR_SHORTHANDS["single"]
    if not isinstance(collector_class, str):
        return collector_class
    if collector_class not in COLLECTOR_SHORTHANDS:
        raise ValueError(
            f"collector_class={collector_class!r} is no collector; pass a collector class or "
            f"one of TorchRL's shorthands {sorted(COLLECTOR_SHORTHANDS)}."
        )
    return COLLECTOR_SHORTHANDS[collector_class]


def check_options(collector_class: Any, options: Mapping[str, Any]) -> None:
    accepted = accepted_options(collector_class)
    if accepted is None:
        return
    for name in options:
        if name not in accepted:
            close = difflib.get_close_matches(name, sorted(accepted), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise TypeError(
                f"{name!r} is not an option of {getattr(collector_class, '__name__', 'the')} "
                f"collector.{hint}"
            )


def check_seed(seed: Any) -> int:
    """`seed` as an int that fits the worker protocol (int64), or an error naming it."""
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int; got {seed!r} ({type(seed).__name__}).")
    if not -(2**63) <= int(seed) < 2**63:
        raise ValueError(f"seed={seed} does not fit in 64 bits; use a smaller seed.")
    return int(seed)


def episode_statistics(workers: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The episode statistics of `Collector.stats()` over all workers: episodes summed, the
    mean returns and lengths averaged over the workers that have finished any (weighted by how
    many episodes each window holds)."""
    episodes = sum(int(worker.get("episodes", 0)) for worker in workers)
    last = [w["mean_episode_return"] for w in workers if w.get("episodes", 0) > 0]
    windows = [
        (w["mean_return_last_100"], min(int(w["episodes"]), RECENT_EPISODES))
        for w in workers
        if w.get("episodes", 0) > 0
    ]
    weight = sum(count for _, count in windows)
    lengths = [
        (w["mean_length_last_100"], min(int(w["episodes"]), RECENT_EPISODES))
        for w in workers
        if w.get("episodes", 0) > 0 and "mean_length_last_100" in w
    ]
    length_weight = sum(count for _, count in lengths)
    return {
        "episodes": episodes,
        "mean_episode_return": sum(last) / len(last) if last else float("nan"),
        "mean_return_last_100": (
            sum(value * count for value, count in windows) / weight if weight else float("nan")
        ),
        "mean_length_last_100": (
            sum(value * count for value, count in lengths) / length_weight
            if length_weight
            else float("nan")
        ),
    }


def gather_batches(batches: Sequence[TensorDictBase], cat_results: CatResults) -> TensorDictBase:
    """Stack the workers' batches along a new first dim, or concatenate them along dim 0 or
    -1 (time). The result is a fresh TensorDict; the workers' shared batches are not kept."""
    shapes = [tuple(batch.batch_size) for batch in batches]
    try:
        if cat_results == "stack":
            gathered = cast(TensorDictBase, torch.stack(list(batches), 0))  # type: ignore[arg-type]
        else:
            gathered = cast(TensorDictBase, torch.cat(list(batches), cat_results))  # type: ignore[arg-type]
    except (RuntimeError, ValueError) as err:
        raise ValueError(
            f"cat_results={cat_results!r} cannot gather worker batches of shapes {shapes}; "
            "'stack' needs equal shapes, 0 equal time lengths, -1 equal env batches."
        ) from err
    if gathered.names[-1] is None and batches[0].names[-1] is not None:
        # Stacks of lazily stacked steps (heterogeneous or dynamic specs) lose the names.
        extra = [None] if cat_results == "stack" else []
        gathered.refine_names(*extra, *batches[0].names)
    return gathered


def episode_layout(options: dict[str, Any]) -> str | None:
    """How the workers' batches of whole episodes are laid out ("cat" or "padded"), or None
    for fixed-size batches."""
    if options.get("trajs_per_batch") is not None:
        return str(options.get("traj_format") or "padded")
    if options.get("batch_mode") == "complete_episodes":
        return "cat"
    return None


def gather_episodes(batches: Sequence[TensorDictBase], layout: str) -> TensorDictBase:
    """The workers' batches of whole episodes as one: flat ones concatenated along time,
    padded ones (`[N, L_w]`) padded to the longest and concatenated along trajectories."""
    if layout == "cat":
        flat = cast(TensorDictBase, torch.cat(list(batches), 0))  # type: ignore[arg-type]
        flat.refine_names(keys.TIME_DIM_NAME)
        return flat
    longest = max(batch.shape[-1] for batch in batches)
    padded = [pad(batch, [0, 0, 0, longest - batch.shape[-1]]) for batch in batches]
    gathered = cast(TensorDictBase, torch.cat(padded, 0))  # type: ignore[arg-type]
    gathered.refine_names(None, keys.TIME_DIM_NAME)
    return gathered


def chosen_children(index: Any, count: int, child: str) -> list[int]:
    """The children `reset(index)` names: all (None), one index, a list of indices, or
    TorchRL's mask (one bool per child).

    Raises:
        ValueError: an index out of range, or a mask of another length.
        TypeError: anything else.
    """
    if index is None:
        return list(range(count))
    if isinstance(index, numbers.Integral) and not isinstance(index, bool):
        chosen = [int(index)]
    elif is_sequence(index) and all(isinstance(flag, bool) for flag in index) and index:
        if len(index) != count:
            raise ValueError(
                f"reset got a mask of {len(index)} flags; this collector has {count} {child}s."
            )
        return [position for position, flag in enumerate(index) if flag]
    elif is_sequence(index) and all(isinstance(i, numbers.Integral) for i in index):
        chosen = [int(i) for i in index]
    else:
        raise TypeError(
            f"reset(index={index!r}): give a {child} index, a list of them, or one bool per "
            f"{child}."
        )
    bad = [i for i in chosen if not 0 <= i < count]
    if bad:
        raise ValueError(f"reset names {child}s {bad}; this collector has {child}s 0..{count - 1}.")
    return chosen


def children_states(state: Mapping[str, Any], key: str, count: int) -> list[Any]:
    """The children's own states in a parent's `state_dict()` (under `key`), checked against
    what this parent is: its counters present, one state per child.

    Raises:
        KeyError: naming what the state lacks.
        ValueError: a state of another number of children.
    """
    missing = {"frames", "iterations", "policy_version", key} - set(state)
    if missing:
        raise KeyError(
            f"the state lacks {sorted(missing)}; pass what this collector's state_dict() returned."
        )
    states = list(state[key])
    if len(states) != count:
        raise ValueError(f"the state holds {len(states)} {key}; this collector has {count}.")
    return states


class CollectorWithChildren(CollectorBase):
    """A collector whose loops run in children (worker processes or Ray actors): an update
    is checked here once (`self.weights.checked`), then sent down by `apply_weights`."""

    weights: Any  # a `weights.sender.SentWeights` or what wraps one
    policy_version: int  # the version of the weights last sent down
    options: Any  # the `options.BatchOptions` of the parent
    _start_time: float | None

    def _check_open(self) -> None:
        raise NotImplementedError

    def _check_idle(self, action: str) -> None:
        raise NotImplementedError

    def _before_batch(self) -> None:
        """Before every batch: the children are up, no background collection races this
        one, the clock has started, and weights a receive scheme holds are sent down."""
        self._check_open()
        self._check_idle("next()")
        if self._start_time is None:
            self._start_time = time.perf_counter()
        self._receive_from_schemes()

    def collect(self, num_steps: int, rollout: TensorDictBase) -> TensorDictBase:
        """Refused: see `collect_rollout`.

        Raises:
            MisuseError: always.
        """
        raise MisuseError(self._in_place_refusal("collect(num_steps=..., rollout=...)"))

    def collect_rollout(self, rollout: TensorDictBase) -> TensorDictBase:
        """Refused: a rollout is filled in place by the loop that writes it, in the process
        that holds it, and this collector's loops run in its children (worker processes or
        Ray actors), each writing a batch of its own.

        Raises:
            MisuseError: always.
        """
        raise MisuseError(self._in_place_refusal("collect_rollout(rollout)"))

    def _in_place_refusal(self, call: str) -> str:
        name = type(self).__name__
        return (
            f"{name}.{call} is not available: filling a rollout in place needs the rollout loop "
            f"in this process, and {name} runs its loops in its children, each writing its own "
            "batch. Fill a RolloutBuffer with Collector(ParallelEnv(...)) or "
            "Collector(SerialEnv(...)) (many envs, one loop here), or iterate this collector "
            "and copy each batch."
        )

    def _update_weights(
        self, source: Any, policy_id: str | None, worker_ids: Any, timeout: float | None
    ) -> None:
        version = self.policy_version + 1
        if not is_per_child(source):
            checked = self.weights.checked(source, policy_id)
            self.apply_weights(checked, version, timeout, worker_ids)
            return
        if worker_ids is not None:
            raise ValueError(
                f"update_policy_weights_ got weights per child (keys {sorted(source)}) and "
                f"worker_ids={worker_ids!r}; the keys already name the children: drop one."
            )
        # TorchRL's per-worker weights, `{worker_index: weights}`: all checked before any is
        # sent, each to its own child, as one version.
        every = {
            index: self.weights.checked(weights, policy_id) for index, weights in source.items()
        }
        for index, checked in every.items():
            self.apply_weights(checked, version, timeout, int(index))


def is_per_child(source: Any) -> bool:
    """Whether `update_policy_weights_` was given TorchRL's per-worker weights: a mapping
    from child indices to weights (a state dict's keys are names)."""
    if not isinstance(source, Mapping) or isinstance(source, TensorDictBase):
        return False  # a TensorDict's keys are names (and it has no truth value)
    return len(source) > 0 and all(
        isinstance(key, numbers.Integral) and not isinstance(key, bool) for key in source
    )


# A child's answer to `getattr_env`: (True, the value), (False, the AttributeError's message),
# or (None, why the value could not be sent back).
EnvAttribute = tuple[bool | None, Any]


def env_attribute(collector: Any, attr: str) -> EnvAttribute:
    """What a child (worker or actor) answers to `getattr_env(attr)` of its collector."""
    try:
        return True, collector.getattr_env(attr)
    except AttributeError as err:
        return False, str(err)


def unpack_env_attribute(answer: EnvAttribute, attr: str) -> Any:
    """The value of a child's `env_attribute` answer; its AttributeError raised here (as
    TorchRL's `getattr_env` raises the first worker's).

    Raises:
        AttributeError: the env has no attribute `attr`.
        TypeError: the value could not be sent back from the child.
    """
    found, value = answer
    if found is None:
        raise TypeError(f"getattr_env({attr!r}): {value}")
    if not found:
        raise AttributeError(value)
    return value


WorkerView = Literal["aggregate", "per_worker", "both"]
WORKER_VIEWS = get_args(WorkerView)


def check_worker_view(workers: Any) -> WorkerView:
    """`stats(workers=...)`'s value, or an error naming the three TorchRL takes."""
    if workers not in WORKER_VIEWS:
        raise ValueError(
            f"workers must be one of 'aggregate', 'per_worker' or 'both', got {workers!r}: "
            "'aggregate' for the collector's counters, 'per_worker' for each child's as "
            "'worker_<i>/<name>', 'both' for the two."
        )
    return cast(WorkerView, workers)


def worker_view(
    aggregate: Mapping[str, Any], children: Sequence[Mapping[str, Any]], workers: WorkerView
) -> dict[str, Any]:
    """A collector's `stats()` in TorchRL's worker views: `aggregate` (its counters, with
    `"workers"` and `"workers_alive"` as counts) and/or every child's scalars flattened as
    `"worker_<i>/<name>"` (the child's own counters over its collector's, for loggers that take
    flat scalars). `children` are the per-child dicts, each with its collector's stats under
    `"collector"`."""
    counts = ("workers", "workers_alive")
    view = dict(aggregate) if workers != "per_worker" else {k: aggregate[k] for k in counts}
    if workers == "aggregate":
        return view
    for index, child in enumerate(children):
        own = {**child.get("collector", {}), **child}
        for name, value in own.items():
            if isinstance(value, numbers.Number | str) or value is None:
                view[f"worker_{index}/{name}"] = value
    return view

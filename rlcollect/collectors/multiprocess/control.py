"""The multi-process collectors' controls between batches: seeding, profiling, trajectory
ids, checkpoints and statistics, each a request to every worker (or to the chosen ones).

`MultiCollectorControl` holds them; `MultiCollectorBase` (base.py) holds the workers' start,
the gathering of their batches, weights and background collection.
"""

from __future__ import annotations

import dataclasses
import pickle
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import cloudpickle
from tensordict import TensorDict, TensorDictBase

from rlcollect.collectors.children import (
    CollectorWithChildren,
    WorkerView,
    check_seed,
    check_worker_view,
    children_states,
    chosen_children,
    episode_statistics,
    unpack_env_attribute,
    worker_view,
)
from rlcollect.collectors.multiprocess.pool import WorkerPool
from rlcollect.collectors.multiprocess.worker import SEED_REPLY, WorkerCommand
from rlcollect.collectors.policy.weights import (
    WeightsLayout,
    layout_template,
    state_layout,
    validated_weights,
)
from rlcollect.collectors.single.profiling import ProfileConfig
from rlcollect.collectors.weights.sender import (
    CHILD_TIMEOUT_SHARE,
    check_update_timeout,
    select_children,
)
from rlcollect.errors import MisuseError


class MultiCollectorControl(CollectorWithChildren):
    """Seeding, profiling, trajectory ids, checkpoints and statistics of a multi-process
    collector (see `MultiSyncCollector`)."""

    # Set by `MultiCollectorBase.__init__`.
    pool: WorkerPool
    num_workers: int
    iterations: int
    policy_version: int
    total_frames: int
    frames_per_batch: int
    _frames: int
    _start_time: float | None
    _final: tuple[dict[str, Any], dict[str, Any]] | None
    _in_background: bool
    _pauses: int

    def _check_idle(self, action: str) -> None:
        """Refuse what would race the workers' background collection (as `Collector` does)."""
        if self._in_background and not self._pauses:
            raise MisuseError(
                f"{action} cannot run while the workers fill the buffer in the background; "
                "call it inside `with collector.pause():` or after async_shutdown()."
            )

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed the workers in a chain (worker i + 1 gets what worker i returns), so every
        worker is seeded apart and the same seed gives the same batches; returns the next
        seed. With `static_seed` (TorchRL's), every worker gets `seed` (the sub-envs of a
        worker's batched env still get `seed + i`) and `seed` is returned. Each worker's next
        batch starts from a reset."""
        self._check_idle("set_seed()")
        seed = first = check_seed(seed)
        for slot in self.pool.slots:
            slot.seed = first if static_seed else seed
            (reply,) = self.pool.request([slot], WorkerCommand.SEED, slot.seed)
            seed = SEED_REPLY.unpack(reply)[0]
        return first if static_seed else seed

    def enable_profile(self, *, workers: Sequence[int] | None = None, **options: Any) -> None:
        """Profile the next batches of `workers` (default `[0]`) in their own processes, as
        TorchRL's `enable_profile`; each exports its trace to `save_path` with `{worker_idx}`
        filled in (see `Collector.enable_profile` for the options)."""
        self._check_idle("enable_profile()")
        chosen = [0] if workers is None else list(workers)
        bad = [index for index in chosen if not 0 <= index < len(self.pool.slots)]
        if bad:
            raise ValueError(
                f"enable_profile workers={chosen} names workers {bad} that do not exist; this "
                f"collector has workers 0..{len(self.pool.slots) - 1}."
            )
        config = ProfileConfig(workers=chosen, **options)
        for index in chosen:  # each worker's trace path names its index here
            own = dataclasses.replace(config, save_path=config.trace_path(index))
            slot = self.pool.slots[index]
            self.pool.request([slot], WorkerCommand.PROFILE, payload=pickle.dumps(own))

    @property
    def pre_collect_hook(self) -> Callable[[], None] | None:
        """Called with no argument before each worker collects a batch, in the worker's process
        (TorchRL's attribute: setting it reaches every worker, a restarted one too)."""
        return self.pool.specs[0].collector_kwargs.get("pre_collect_hook")

    @pre_collect_hook.setter
    def pre_collect_hook(self, hook: Callable[[], None] | None) -> None:
        self._set_workers_hook("pre_collect_hook", hook)

    @property
    def post_collect_hook(self) -> Callable[[TensorDictBase], None] | None:
        """Called with each batch a worker has collected, in the worker's process (TorchRL's
        attribute: setting it reaches every worker, a restarted one too)."""
        return self.pool.specs[0].collector_kwargs.get("post_collect_hook")

    @post_collect_hook.setter
    def post_collect_hook(self, hook: Callable[[TensorDictBase], None] | None) -> None:
        self._set_workers_hook("post_collect_hook", hook)

    def _set_workers_hook(self, name: str, hook: Callable[..., Any] | None) -> None:
        if hook is not None and not callable(hook):
            raise TypeError(f"{name} must be a callable or None; got {hook!r}.")
        self._check_idle(f"setting {name}")
        payload = cloudpickle.dumps(("set", name, hook))  # closures and lambdas travel too
        self.pool.request(self.pool.slots, WorkerCommand.REMOTE, 0, payload)
        for spec in self.pool.specs:  # what a restarted worker is built with
            spec.collector_kwargs[name] = hook

    def profile_with(self, config: ProfileConfig) -> None:
        """As a worker of a parent collector: profile this collector's first worker."""
        self.pool.request(self.pool.slots[:1], WorkerCommand.PROFILE, payload=pickle.dumps(config))

    def disable_profile(self) -> None:
        """Stop profiling in every worker (what was recorded is exported)."""
        if self.pool.is_open:
            self.pool.request(self.pool.slots, WorkerCommand.PROFILE)

    def reset(self, index: Any = None) -> None:
        """Every worker (or those `index` names: one index, a list, or TorchRL's one bool
        per worker) starts new trajectories at its next batch."""
        self._check_idle("reset()")
        chosen = chosen_children(index, self.num_workers, "worker")
        self.pool.request([self.pool.slots[i] for i in chosen], WorkerCommand.RESET)

    def getattr_env(self, attr: str) -> Any:
        """An attribute of the first worker's env (TorchRL's).

        Raises:
            AttributeError: that env has no attribute `attr`.
            TypeError: its value cannot be pickled back.
        """
        payload = attr.encode()
        (reply,) = self.pool.request([self.pool.slots[0]], WorkerCommand.GETATTR_ENV, 0, payload)
        return unpack_env_attribute(pickle.loads(reply), attr)

    def get_distant_attr(self, attr: str) -> list[Any]:
        """What the attribute path `attr` names on each worker's collector, in worker order
        (TorchRL's; e.g. `"worker_idx"` or `"replay_buffer.write_count"`)."""
        replies = self.pool.request(
            self.pool.slots, WorkerCommand.REMOTE, 0, pickle.dumps(("get", attr))
        )
        return [pickle.loads(reply) for reply in replies]

    def map_fn(
        self,
        method_name: str,
        list_of_args: Sequence[tuple[Any, ...]] | None = None,
        list_of_kwargs: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[Any]:
        """Call the method `method_name` (an attribute path) on each worker's collector, with
        that worker's entry of `list_of_args` / `list_of_kwargs` (none: no arguments), and
        return the results in worker order (TorchRL's).

        Raises:
            ValueError: a list without one entry per worker.
        """
        count = self.num_workers
        list_of_args = [()] * count if list_of_args is None else list(list_of_args)
        list_of_kwargs = [{}] * count if list_of_kwargs is None else list(list_of_kwargs)
        for name, entries in (("argument", list_of_args), ("keyword-argument", list_of_kwargs)):
            if len(entries) != count:
                raise ValueError(
                    f"map_fn({method_name!r}): Expected {count} {name} entries, got "
                    f"{len(entries)}: one per worker."
                )
        replies = [
            self.pool.request(
                [slot],
                WorkerCommand.REMOTE,
                0,
                pickle.dumps(("call", method_name, tuple(args), dict(kwargs))),
            )[0]
            for slot, args, kwargs in zip(
                self.pool.slots, list_of_args, list_of_kwargs, strict=True
            )
        ]
        return [pickle.loads(reply) for reply in replies]

    def frames_per_batch_worker(self, *, worker_idx: int | None = None) -> int:
        """Frames a worker collects per batch (worker 0's when `worker_idx` is None), as
        TorchRL's.

        Raises:
            ValueError: no worker has that index.
        """
        index = worker_idx or 0
        if not 0 <= index < len(self.pool.slots):
            raise ValueError(
                f"frames_per_batch_worker(worker_idx={worker_idx}): this collector has workers "
                f"0..{len(self.pool.slots) - 1}."
            )
        return self.pool.slots[index].frames_per_batch

    def get_cached_weights(self, model_id: str) -> TensorDictBase | None:
        """The weights the workers hold (what the last update sent), as a TensorDict; None
        for a model other than "policy" or a collector without weights (TorchRL's)."""
        held = self.weights.current
        if model_id != "policy" or not held:
            return None
        return TensorDict(dict(held), batch_size=[]).unflatten_keys(".")

    def _policy_model(self) -> Any:
        return self.weights.policy

    @property
    def policy(self) -> Any:
        """TorchRL's `policy` of a multi-process collector: the policy it was given, where
        updates without weights read them (None with random actions).

        With a `policy_factory` alone the workers build their policies and none is sent;
        reading `policy` then builds one here with the factory, once: the module a TorchRL
        weight-sync scheme of a parent (e.g. `DistributedCollector`'s, on a node that runs
        this collector) writes received weights into before it passes them on with
        `update_policy_weights_(weights)`, as TorchRL's node builds one for its own
        multi-process collectors. It starts with the factory's weights, and updates without
        weights still need a policy given at construction.
        """
        return self.weights.policy_here()

    def policy_layout(self) -> WeightsLayout:
        """The names, shapes and dtypes of the workers' policy weights (this collector as a
        worker of another)."""
        return state_layout(self.weights.template)

    def model_layout(self, model_id: str) -> WeightsLayout:
        """The layout of the weights of the model `model_id` names in the workers (worker
        0's, asked once per model id; every worker builds the same env).

        Raises:
            KeyError / TypeError: the model id names no module there.
        """
        layouts: dict[str, WeightsLayout] = self.__dict__.setdefault("_model_layouts", {})
        if model_id not in layouts:
            first = self.pool.slots[:1]
            (reply,) = self.pool.request(first, WorkerCommand.MODEL_LAYOUT, 0, model_id.encode())
            found, answer = pickle.loads(reply)
            if not found:
                raise answer
            layouts[model_id] = answer
        return layouts[model_id]

    def _update_models(
        self, models: dict[str, Any], worker_ids: Any, timeout: float | None
    ) -> None:
        """Check each model's weights against the workers' model, then send them all to
        `worker_ids` (None: every worker) and wait until each has loaded them."""
        checked = {
            model_id: validated_weights(
                source, layout_template(self.model_layout(model_id)), target=f"model {model_id!r}"
            )
            for model_id, source in models.items()
        }
        self.apply_model_weights(checked, timeout, worker_ids)

    def apply_model_weights(
        self,
        models: Mapping[str, Any],
        timeout: float | None = None,
        worker_ids: int | Sequence[int] | None = None,
    ) -> None:
        """Send checked weights of other models to the workers and wait for every
        acknowledgement; a restarted worker starts with them."""
        self.pool.check_open()
        timeout = check_update_timeout(timeout)
        slots = select_children(self.pool.slots, worker_ids, "worker")
        sent = {
            model_id: {n: t.detach().cpu() for n, t in w.items()} for model_id, w in models.items()
        }
        for slot in slots:
            self.pool.specs[slot.index].models.update(sent)
        payload = pickle.dumps((timeout * CHILD_TIMEOUT_SHARE, sent))
        self.pool.request(slots, WorkerCommand.UPDATE_MODELS, 0, payload, timeout)

    def assign_trajectory_ids(self, offset: int, stride: int) -> None:
        """Draw trajectory ids from `offset + k * stride`, shared out among the workers."""
        for slot in self.pool.slots:
            # Worker i of W draws from offset + (i + k W) * stride.
            worker_ids = (offset + slot.index * stride, stride * self.num_workers)
            self.pool.specs[slot.index].trajectory_ids = worker_ids
            payload = pickle.dumps(worker_ids)
            self.pool.request([slot], WorkerCommand.TRAJECTORY_IDS, 0, payload)

    def state_dict(self) -> dict[str, Any]:
        """Counters, the policy version and every worker's own state (after
        `async_shutdown()`, the state the workers ended with)."""
        if self._final is not None and not self.pool.is_open:
            return self._final[0]
        replies = self.pool.request(self.pool.slots, WorkerCommand.STATE_DICT)
        workers = [pickle.loads(reply) for reply in replies]
        return {
            "frames": self.frames,
            "iterations": self.iterations,
            "policy_version": self.policy_version,
            "workers": workers,
            # TorchRL's layout too: each worker's state under "worker0", "worker1", ...
            **{f"worker{index}": state for index, state in enumerate(workers)},
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume from `state_dict()`, worker by worker."""
        self._check_idle("load_state_dict()")
        state = state_dict
        workers = children_states(state, "workers", self.num_workers)
        for slot, worker_state in zip(self.pool.slots, workers, strict=True):
            self.pool.request([slot], WorkerCommand.LOAD_STATE_DICT, 0, pickle.dumps(worker_state))
        self._frames = int(state["frames"]) - self.pool.count_written()
        self.iterations = int(state["iterations"])
        self.policy_version = int(state["policy_version"])

    def stats(self, workers: WorkerView = "aggregate") -> dict[str, Any]:
        """Frames, batches, frames/s, the policy version, episode statistics over the workers,
        `"workers"` and `"workers_alive"` (counts, as TorchRL's) and, under `"per_worker"`, per
        worker: its pid, whether it is alive, frames, restarts, policy version, and its own
        statistics (with its workers', for a worker that has workers). `workers="per_worker"`
        or `"both"` add each worker's scalars as `"worker_<i>/<name>"` (TorchRL's views).
        After `async_shutdown()`, those it ended with."""
        view = check_worker_view(workers)
        if self._final is not None and not self.pool.is_open:
            final = self._final[1]
            return worker_view(final, final["per_worker"], view)
        replies = self.pool.request(self.pool.slots, WorkerCommand.STATS)
        elapsed = time.perf_counter() - self._start_time if self._start_time else 0.0
        children = []
        for slot, reply in zip(self.pool.slots, replies, strict=True):
            collector = pickle.loads(reply)
            children.append(
                {
                    "pid": slot.handle.pid,
                    "alive": self.pool.alive(slot),
                    # What it handed back, or what it wrote to the buffer in the background.
                    "frames": max(slot.frames, int(collector["frames"])),
                    "restarts": slot.restarts,
                    "policy_version": slot.policy_version,
                    "collector": collector,
                }
            )
        aggregate = {
            "frames": self.frames,
            "total_frames": self.total_frames,
            "batches": self.iterations,
            "completed": self.is_done,
            "requested_frames_per_batch": self.frames_per_batch,
            "frames_per_second": self.frames / elapsed if elapsed > 0 else 0.0,
            "policy_version": self.policy_version,
            **episode_statistics([child["collector"] for child in children]),
            "weight_update_seconds": self.weight_update_seconds,
            "workers": len(children),
            "workers_alive": sum(bool(child["alive"]) for child in children),
            "per_worker": children,
        }
        return worker_view(aggregate, children, view)

    def process_ids(self) -> list[int]:
        """Every process below this collector: its workers and, recursively, theirs."""
        pids: list[int] = []

        def walk(stats: Mapping[str, Any]) -> None:
            for worker in stats.get("per_worker", ()):
                pids.append(worker["pid"])
                walk(worker["collector"])

        walk(self.stats())
        return pids

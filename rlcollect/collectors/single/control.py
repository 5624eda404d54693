"""The `Collector`'s controls around its rollout loop: weights, checkpoints, seeding,
profiling and statistics.

`CollectorControl` holds what a user (or a parent collector) does between batches; the
`Collector` subclass builds the loop (`collectors/rollout.py`) and delivers its batches. Every
control that changes what the loop uses checks first that no batch is being collected in the
background.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from typing import Any

import torch
from tensordict import TensorDictBase

from rlcollect.collectors.attribute_path import resolve_attribute_path, resolve_model
from rlcollect.collectors.base import CollectorBase
from rlcollect.collectors.carrier import CarrierLayout
from rlcollect.collectors.options import BatchOptions
from rlcollect.collectors.policy.holder import PolicyHolder
from rlcollect.collectors.policy.weights import (
    WeightsLayout,
    flat_weights,
    transient_names,
    validated_weights,
    weights_layout,
)
from rlcollect.collectors.rollout import TrajectoryStream
from rlcollect.collectors.sampling.whole_episodes import EpisodeAssembler
from rlcollect.collectors.single.background import BackgroundLoop
from rlcollect.collectors.single.profiling import ProfileConfig, ProfilingHook, RolloutProfiler
from rlcollect.collectors.weights.model_senders import ModelSenders
from rlcollect.envs.torchrl_env import TorchRLEnv, is_torchrl_env
from rlcollect.errors import MisuseError
from rlcollect.transforms.step_limit import StepLimit


class CollectorControl(CollectorBase):
    """Weights, state, seeding, profiling and statistics of a `Collector` (see there)."""

    # Set by `Collector.__init__`.
    stepped_env: Any  # the env the loop steps: ours, or our adapter around a TorchRL env
    policy_holder: PolicyHolder  # the policy on its device, its version, its per-step call
    options: BatchOptions
    worker_idx: int | None
    frames: int
    iterations: int
    total_frames: int
    frames_per_batch: int
    _background: BackgroundLoop
    stream: TrajectoryStream
    layout: CarrierLayout
    _whole_episodes: EpisodeAssembler | None
    _start_time: float | None
    _frames_at_start: int
    _profiler: RolloutProfiler | None
    _pre_collect_hook: Callable[[], None] | None
    _model_senders: ModelSenders

    def _check_idle(self, action: str) -> None:
        if self._background.is_busy:
            raise MisuseError(
                f"{action} cannot run while the collector fills its buffer in the background; "
                "call it inside `with collector.pause():` or after async_shutdown()."
            )

    # --- weights ----------------------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        """How many times the policy weights were updated (or `increment_version()` called).
        TorchRL's is None without `track_policy_version`; ours always counts."""
        return self.policy_holder.version

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        self.policy_holder.version = version

    def _policy_model(self) -> Any:
        """The module the collector runs (None with random actions): weights loaded into it
        are the ones used."""
        return self.policy

    @property
    def policy(self) -> Any:
        """The policy the steps run (TorchRL's `collector.policy`): the module given, or
        the copy moved to `policy_device`, wrapped into a `TensorDictModule` where a plain
        module was given; None with random actions. Weight-sync schemes (e.g. TorchRL's
        `DistributedCollector`'s on a node running this collector) read and write it."""
        return self.policy_holder.module

    @property
    def env(self) -> Any:
        """The env as its user knows it (TorchRL's `collector.env`): a TorchRL env handed
        over is that env itself, with the transforms appended for the policy, not the
        adapter the loop steps (`stepped_env`); one of ours is the env the loop steps."""
        env = self.stepped_env
        while isinstance(env, StepLimit):
            env = env.env
        return env.env if isinstance(env, TorchRLEnv) else self.stepped_env

    def getattr_env(self, attr: str) -> Any:
        """An attribute of the env (TorchRL's)."""
        return getattr(self.env, attr)

    def _update_weights(
        self, source: Any, policy_id: str | None, worker_ids: Any, timeout: float | None
    ) -> None:
        """Load `source` (None: the weights of the policy the collector was given, copied
        again, e.g. to a copy on another device) in place; with `policy_id`, into that one
        policy of the map, else the whole map's (`"policies.<id>.<name>"`)."""
        self.policy_holder.update(source, policy_id=policy_id)

    def _update_models(
        self, models: dict[str, Any], worker_ids: Any, timeout: float | None
    ) -> None:
        """Load each model's weights in place, into the module its model id names on this
        collector (e.g. `"env.transform[0].module"`), every one checked before any is
        loaded; `worker_ids` and `timeout` are unused here (no children). A model with a
        scheme of its own (`weight_sync_schemes`, see `ModelSenders`) gets them through it,
        with `worker_ids`."""
        sent, models = self._model_senders.split(models)
        checked = {}
        for model_id, source in models.items():
            module = resolve_model(self._model_root(), model_id, type(self).__name__)
            target = f"model {model_id!r}"
            checked[model_id] = validated_weights(
                source, flat_weights(module), transient_names(module), target
            )
        self.apply_model_weights(checked)
        self._model_senders.send(sent, worker_ids)

    def model_layout(self, model_id: str) -> WeightsLayout:
        """The names, shapes and dtypes of the weights of the model `model_id` names (what a
        parent checks an update against before sending it).

        Raises:
            KeyError / TypeError: as `resolve_model`.
        """
        return weights_layout(resolve_model(self._model_root(), model_id, type(self).__name__))

    def policy_layout(self) -> WeightsLayout:
        """The names, shapes and dtypes of the policy's weights (empty: random actions, or a
        policy without weights): what a parent with only a policy factory checks updates
        against."""
        module = self.policy_holder.module
        return weights_layout(module) if isinstance(module, torch.nn.Module) else {}

    def _model_root(self) -> Any:
        """What model ids are resolved on: this collector, with `env` the env it was given
        (a TorchRL env, not the wrappers it steps), as in TorchRL's collector."""
        return _ModelRoot(self)

    def apply_model_weights(self, models: Mapping[str, Any], timeout: float | None = None) -> None:
        """Load weights a parent already checked into the models their ids name (between
        batches, pausing background collection); `timeout` is unused (no children)."""
        root, owner = self._model_root(), type(self).__name__
        targets = {model_id: resolve_model(root, model_id, owner) for model_id in models}
        paused = self._background.pause() if self._background.is_busy else nullcontext()
        with paused, torch.no_grad():
            for model_id, module in targets.items():
                module.load_state_dict(dict(models[model_id]), strict=True)

    def apply_weights(
        self,
        weights: Any,
        version: int,
        timeout: float | None = None,
        worker_ids: int | Sequence[int] | None = None,
    ) -> None:
        """Load weights sent by a parent collector, as policy version `version` (between
        batches: a worker calls it when its update command arrives). `timeout` and
        `worker_ids` are unused here: this collector has no children."""
        if self._background.is_busy:
            with self._background.pause():
                self.policy_holder.update(weights, version)
        else:
            self.policy_holder.update(weights, version)

    def assign_trajectory_ids(self, offset: int, stride: int) -> None:
        """Draw trajectory ids from `offset + k * stride` (a parent gives each worker its
        own progression, so that ids are unique across all workers)."""
        self.stream.trajectories.offset, self.stream.trajectories.stride = offset, stride

    def _poll_weight_schemes(self) -> None:
        self._receive_from_schemes()

    # --- checkpoints, seeding, statistics ---------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Frames, iterations, the trajectory counter, policy weights, env state and the
        finished-episode statistics of `stats()`."""
        state: dict[str, Any] = {
            "frames": self.frames,
            "iterations": self.iterations,
            "next_traj_id": self.stream.trajectories.next_id,
            "policy_version": self.policy_holder.version,
            "policy_state_dict": self.policy_holder.state_dict(),
            "episode_stats": self.stream.episodes.state_dict(),
        }
        if hasattr(self.stepped_env, "state_dict"):
            state["env_state_dict"] = self.stepped_env.state_dict()
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume from `state_dict()`: counters go on, no trajectory id is reused."""
        self._check_idle("load_state_dict()")
        state = state_dict
        self.frames = self._frames_at_start = int(state["frames"])
        self.iterations = int(state["iterations"])
        self.stream.trajectories.next_id = max(
            self.stream.trajectories.next_id, int(state["next_traj_id"])
        )
        self.policy_holder.load_state_dict(state["policy_state_dict"], int(state["policy_version"]))
        if "env_state_dict" in state and hasattr(self.stepped_env, "load_state_dict"):
            self.stepped_env.load_state_dict(state["env_state_dict"])
        if "episode_stats" in state:  # absent from checkpoints of earlier versions
            self.stream.episodes.load_state_dict(state["episode_stats"])
        self.stream.needs_reset = True

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed the env (sub-env i gets `seed + i`) and return the next free seed; the next
        batch starts from a reset. With `static_seed` (TorchRL's), every sub-env gets `seed`
        and `seed` is returned.

        Raises:
            ValueError: `static_seed` with an rlcollect env of several sub-envs (its
                sub-envs are always seeded apart).
        """
        self._check_idle("set_seed()")
        self.stream.needs_reset = True
        env = self.stepped_env
        if not static_seed:
            return env.set_seed(seed)
        if is_torchrl_env(env):
            return env.set_seed(seed, static_seed=True)
        if env.batch_size.numel() > 1:
            raise ValueError(
                f"set_seed(static_seed=True) gives every sub-env the same seed, but this env's "
                f"{env.batch_size.numel()} sub-envs are always seeded apart (seed + i); "
                "use static_seed=False."
            )
        env.set_seed(seed)
        return seed

    def reset(self, index: Any = None) -> None:
        """Start new trajectories: the next batch begins with an env reset; with `index`
        (TorchRL's: any index of the env batch, e.g. `1`, `[0, 2]` or a bool mask), only those
        sub-envs are reset and get new trajectory ids, the others go on.

        Raises:
            ValueError: `index` on an env without a batch, or one that does not index it; or
                with whole-episode batches or trajectory views (every sub-env at once there).
        """
        self._check_idle("reset()")
        if index is None:
            self.stream.needs_reset = True
            return
        mask = self._sub_env_mask(index)
        pending = self.stream.reset_mask
        self.stream.reset_mask = mask if pending is None else pending | mask

    def _sub_env_mask(self, index: Any) -> torch.Tensor:
        """`index` as a bool mask over the env batch, checked."""
        batch_size = self.stepped_env.batch_size
        if not batch_size:
            raise ValueError(
                f"reset(index={index!r}): the env has no batch of sub-envs to index; call "
                "reset() (TorchRL refuses it too)."
            )
        if self._whole_episodes is not None or not self.layout.restarts_some_sub_envs:
            raise ValueError(
                f"reset(index={index!r}): with whole-episode batches or trajectory views the "
                "collector resets every sub-env at once; call reset()."
            )
        mask = torch.zeros(batch_size, dtype=torch.bool)
        try:
            mask[index] = True
        except (IndexError, TypeError, RuntimeError) as err:
            raise ValueError(
                f"reset(index={index!r}) does not index the env batch of size "
                f"{tuple(batch_size)}: {err}"
            ) from err
        return mask

    def stats(self) -> dict[str, float]:
        """Frames, batches, frames/s, episodes finished, and the mean episode return twice: over
        the episodes finished in the last batch that finished any (`mean_episode_return`), and
        over the last 100 finished episodes (`mean_return_last_100`, as SB3's `ep_rew_mean`);
        the mean length of those 100 (`mean_length_last_100`, SB3's `ep_len_mean`); the
        seconds the last `update_policy_weights_` took (`weight_update_seconds`, NaN before
        the first); also TorchRL's `total_frames`, `completed`, `requested_frames_per_batch` and
        `policy_version`."""
        elapsed = time.perf_counter() - self._start_time if self._start_time else 0.0
        collected = self.frames - self._frames_at_start
        return {
            "frames": self.frames,
            "batches": self.iterations,
            "frames_per_second": collected / elapsed if elapsed > 0 else 0.0,
            "episodes": self.stream.episodes.episodes,
            "mean_episode_return": self.stream.episodes.mean_return,
            "mean_return_last_100": self.stream.episodes.recent_mean_return,
            "mean_length_last_100": self.stream.episodes.recent_mean_length,
            "weight_update_seconds": self.weight_update_seconds,
            # TorchRL's entries, for code written against its stats()
            "total_frames": self.total_frames,
            "completed": self.is_done,
            "requested_frames_per_batch": self.frames_per_batch,
            "policy_version": self.policy_holder.version,
        }

    # --- remote-friendly helpers (TorchRL's) --------------------------------------------------

    def get_distant_attr(self, attr: str) -> Any:
        """What the attribute path `attr` names on this collector (e.g. `"worker_idx"` or
        `"env.transform[0]"`), as TorchRL's; a parent collector asks its workers this."""
        return resolve_attribute_path(self, attr)

    def map_fn(
        self,
        method_name: str,
        list_of_args: Sequence[tuple[Any, ...]] | None = None,
        list_of_kwargs: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[Any]:
        """Call the method `method_name` (an attribute path) once per entry of `list_of_args`
        / `list_of_kwargs`, here, and return the results in order (TorchRL's).

        Raises:
            ValueError: the two lists have different lengths.
            AttributeError: `method_name` names something that is not callable.
        """
        if list_of_args is None:
            list_of_args = [()] * (len(list_of_kwargs) if list_of_kwargs else 1)
        if list_of_kwargs is None:
            list_of_kwargs = [{}] * len(list_of_args)
        if len(list_of_args) != len(list_of_kwargs):
            raise ValueError(
                f"map_fn({method_name!r}): list_of_args and list_of_kwargs must have the same "
                f"length; got {len(list_of_args)} and {len(list_of_kwargs)}."
            )
        method = resolve_attribute_path(self, method_name)
        if not callable(method):
            raise AttributeError(f"map_fn({method_name!r}): that attribute is not callable.")
        return [
            method(*args, **kwargs)
            for args, kwargs in zip(list_of_args, list_of_kwargs, strict=True)
        ]

    # --- hooks and profiling ---------------------------------------------------------------------

    @property
    def pre_collect_hook(self) -> Callable[[], None] | None:
        """Called with no argument before every batch is collected (TorchRL's); settable."""
        return self._pre_collect_hook

    @pre_collect_hook.setter
    def pre_collect_hook(self, hook: Callable[[], None] | None) -> None:
        if hook is not None and not callable(hook):
            raise TypeError(f"pre_collect_hook must be a callable or None; got {hook!r}.")
        self._pre_collect_hook = hook

    @property
    def post_collect_hook(self) -> Callable[[TensorDictBase], None] | None:
        """Called with every finished batch, after `postproc` (TorchRL's); settable. While
        profiling, it is the profiler's hook, which calls the user's hook first."""
        return self.options.post_collect_hook

    @post_collect_hook.setter
    def post_collect_hook(self, hook: Callable[[TensorDictBase], None] | None) -> None:
        self.options.set_post_collect_hook(hook)

    def enable_profile(self, **options: Any) -> None:
        """Profile the next batches with PyTorch's profiler, as TorchRL's `enable_profile`:
        `num_rollouts=3` batches of which `warmup_rollouts=1` warm up, the trace exported to
        `save_path` (default `./collector_profile_{worker_idx}.json`) or handed to
        `on_trace_ready`; also `activities`, `record_shapes`, `profile_memory`, `with_stack`,
        `with_flops`. `workers` is for multi-process collectors and ignored here. The profiler
        counts batches as the post-collect hook (the user's hook still runs first).

        Raises:
            RuntimeError: a batch was already collected (the profiler would miss the warm-up).
        """
        config = ProfileConfig(**options)
        if self.iterations > 0:
            raise RuntimeError(
                "Cannot enable profiling after iteration has started: call enable_profile() "
                "before the first batch is collected."
            )
        self.profile_with(config)

    def profile_with(self, config: ProfileConfig) -> None:
        """`enable_profile` with its options checked (a multi-process parent sends these)."""
        self._check_idle("enable_profile()")
        self.disable_profile()
        self._profiler = RolloutProfiler(config, self.worker_idx or 0)
        self.options.set_post_collect_hook(ProfilingHook(self._profiler, self.post_collect_hook))

    def disable_profile(self) -> None:
        """Stop profiling now (what was recorded is exported) and put the user's post-collect
        hook back; a no-op when not profiling."""
        if self._profiler is None:
            return
        self._profiler.stop()
        self._profiler = None
        hook = self.post_collect_hook
        if isinstance(hook, ProfilingHook):
            self.options.set_post_collect_hook(hook.user_hook)

    @property
    def profile_config(self) -> ProfileConfig | None:
        """The running profiling session's options, or None."""
        profiler = self._profiler
        return None if profiler is None or profiler.done else profiler.config


class _ModelRoot:
    """A collector seen as TorchRL's: `env` is the env it was given (under the step limit of
    `max_frames_per_traj` and the TorchRL adapter the collector added), anything else is the
    collector's. A model id such as `"env.transform[0].module"` names the user's objects."""

    def __init__(self, collector: Any) -> None:
        self._collector = collector
        env = collector.env
        while isinstance(env, StepLimit):
            env = env.env
        self.env = env

    def __getattr__(self, name: str) -> Any:
        return getattr(self._collector, name)

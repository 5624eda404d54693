"""`Collector`: steps an env with a policy and yields `[*env_batch, T]` batches named "time"."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from rlcollect.batch.compact import compact_batch
from rlcollect.batch.flags import end_flag_keys
from rlcollect.batch.next_observations import drop_next_observations
from rlcollect.collectors.carrier import CarrierLayout
from rlcollect.collectors.devices import DeviceLike, DeviceSplit
from rlcollect.collectors.legacy_updater import check_weight_updater
from rlcollect.collectors.options import (
    BatchOptions,
    CollectHook,
    optional_frames,
    round_to_batches,
    validate_frames,
)
from rlcollect.collectors.policy.acceleration import PolicyAcceleration, RequestedAcceleration
from rlcollect.collectors.policy.env_transforms import register_policy_transforms
from rlcollect.collectors.policy.holder import PolicyHolder
from rlcollect.collectors.policy.policy_map import bind_policy_map, policy_or_map
from rlcollect.collectors.policy.resolve import (
    lend_action_spec,
    lend_exploration_spec,
    warn_if_action_misfits,
)
from rlcollect.collectors.rollout import (
    BatchAbandonedError,
    LoopFlags,
    RolloutLoop,
    TrajectoryStream,
)
from rlcollect.collectors.sampling.trajectory_views import TrajectoryViews
from rlcollect.collectors.sampling.view_requirements import ViewRequirement
from rlcollect.collectors.sampling.whole_episodes import EpisodeAssembler
from rlcollect.collectors.single.background import BackgroundLoop
from rlcollect.collectors.single.control import CollectorControl
from rlcollect.collectors.single.front_door import build_elsewhere, one_env_maker
from rlcollect.collectors.single.profiling import RolloutProfiler
from rlcollect.collectors.single.rollout_storage import RolloutStorage, check_num_steps
from rlcollect.collectors.single.setup import (
    BatchGeometry,
    Sampling,
    check_leaf_schemes,
    check_loop_arguments,
    check_torchrl_arguments,
    policy_from_factory,
    refuse_interruptor_with_whole_episodes,
)
from rlcollect.collectors.stacked_carrier import (
    StackedCarrierLayout,
    fits_one_buffer,
    refuse_options_needing_one_buffer,
)
from rlcollect.collectors.weights.model_senders import ModelSenders
from rlcollect.envs.factory import make_env
from rlcollect.errors import MisuseError


class Collector(CollectorControl, torchrl_shorthand="single"):
    """Collects batches of transitions from an env and a policy, in this process.

    Each batch is a TensorDict of batch size `[*env.batch_size, T]` (last dim named "time")
    with TorchRL's keys: observations, `"action"` and the policy's other outputs, flags, the
    `"next"` sub-TensorDict and `("collector", "traj_ids")`. With `T = ceil(frames_per_batch /
    env batch numel)`. The output is preallocated once and written in place by the env's buffer
    face; each option is turned into a part at construction, so the step loop has no branch.

    Args:
        create_env_fn: an env (rlcollect or TorchRL), a callable returning one, or a Gymnasium id.
        policy: None (random actions), a TensorDict module, or an `nn.Module` whose forward
            arguments are named after the observation keys (it is wrapped to write "action").

    Keyword Args:
        frames_per_batch: frames per batch (rounded up to a multiple of the env batch).
        total_frames: frames over the collector's life; -1 collects forever.
        device, storing_device, policy_device, env_device: the device split; `device` fills
            the unset ones.
        create_env_kwargs: keyword arguments for `create_env_fn` when it is a callable or id.
        max_frames_per_traj: truncate and reset a trajectory after that many steps (None,
            0 or -1: no limit).
        init_random_frames: frames collected with random actions before the policy is used
            (None, 0 or -1: none).
        reset_at_each_iter: reset the env at the start of every batch.
        postproc: a callable `batch -> batch` applied to every batch (after `split_trajs`).
        split_trajs: re-shape batches to `[num_trajs, max_len]` with `("collector", "mask")`.
        exploration_type: the interaction type the policy runs under.
        return_same_td: yield the collector's own buffer instead of a fresh copy.
        reset_when_done: must be True (TorchRL's default): a done sub-env is always reset.
        set_truncated: mark the last step of every batch truncated and done. The env is not
            reset there; the next batch goes on from the same state under a new trajectory id
            (TorchRL keeps the old id), so that ids always agree with the done flags.
        replay_buffer: an object with `extend`; iteration extends it and yields None.
        extend_buffer: True (default) extends the buffer with whole batches; False (TorchRL's)
            writes every step as an item of its own, in time order (no `postproc`,
            `split_trajs` or `store_obs_once` then: they need the whole batch).
        track_policy_version: write `("next", "policy_version")` into every frame.
        weight_sync_schemes: accepted as TorchRL's examples pass it (`{"policy": scheme}`,
            ours or TorchRL's), and checked; the policy's is unused, since a single-process
            collector has no children: `update_policy_weights_()` loads the weights in place.
            A TorchRL scheme under another model id (e.g. `{"transform_module":
            RayModuleTransformScheme()}`, whose module runs in a Ray actor) is set up as the
            sender here, and `update_policy_weights_(weights, model_id=...)` sends through
            it, as in TorchRL.
        weight_recv_schemes: mapping of model id to a scheme whose `receive()` returns new
            weights or None; polled before every batch.
        worker_idx: this collector's index when it runs inside a multi-process collector.
        policy_factory: builds the policy (instead of `policy`), as in TorchRL.
        pre_collect_hook: called with no argument before every batch is collected.
        post_collect_hook: called with every finished batch (after `postproc`).
        track_traj_ids: False leaves `("collector", "traj_ids")` out of the batches.
        use_buffers: accepted: True, None or False give the same batches. An env whose
            specs fit one buffer is always written into one; a TorchRL env with
            heterogeneous (lazily stacked) or dynamic specs is always stacked step by step
            (`collectors/stacked_carrier.py`), as TorchRL's `use_buffers=False` does.
        trust_policy: accepted and ignored: the policy's outputs are learnt by one probe
            call at construction, so there is nothing to trust or check per step.
        compile_policy: True or a dict of `torch.compile` keyword arguments: every step runs
            the policy compiled (TorchRL's `warmup` key is accepted; the probe call at
            construction runs uncompiled). Weight updates reach the compiled policy.
            `compiled_policy` (bool) and `compiled_policy_kwargs` (the dict given, else
            `{}`) say what was asked, as TorchRL's attributes do.
        cudagraph_policy: True or a dict of `tensordict.nn.CudaGraphModule` keyword
            arguments: with CUDA the policy is captured in a CUDA graph (after
            `compile_policy`); without CUDA it runs as it is, with a warning, as TorchRL's.
            `cudagraphed_policy` and `cudagraphed_policy_kwargs` say what was asked.
        no_cuda_sync: True or False (default); this collector makes no explicit CUDA
            synchronisation call, so there is none to skip.
        interruptor: TorchRL's `_Interruptor` (any object with `collection_stopped()`),
            polled after every env step: once it answers True the batch ends there. The
            batch keeps its size; its steps past the cut are marked invalid with
            `("collector", "traj_ids")` -1 (their other entries are stale), and the next
            batch goes on from where this one stopped. Not with batches of whole episodes.
        local_init_rb: True, False or None, accepted: a replay buffer's storage is always
            initialised where it is first written (TorchRL 0.14 forces True).
        weight_updater: TorchRL's legacy `WeightUpdaterBase` (or a callable building one):
            the collector registers with it and `update_policy_weights_` hands it every
            update (see `collectors/legacy_updater.py`); `weight_sync_schemes` are the usual way.
        auto_register_policy_transforms: True appends what a recurrent policy needs and the
            env lacks: on a TorchRL env, TorchRL's `InitTracker` and the policy's state
            primers; on ours, our `InitTracker` (the collector carries the state itself).
            None (TorchRL 0.14's default) and False leave the env as it is (None warns, with
            a `FutureWarning`, when something would be added); a policy reading an
            `"is_init"` the env lacks is then refused with a `KeyError`.
        batch_mode: RLlib's "truncate_episodes" (default: fixed-size batches) or
            "complete_episodes": batches of whole episodes, at least `frames_per_batch`
            frames, flat `[frames]` (see `collectors/sampling/whole_episodes.py` for the layout).
        trajs_per_batch, traj_format, trajs_per_write: TorchRL's batches of exactly N whole
            episodes, "padded" (`[N, max_len]` with a mask) or "cat" (flat), and, with a
            replay buffer, the episodes written per extend.
        soft_horizon: with `max_frames_per_traj` (RLlib's horizon), cut trajectories there
            (truncated, new id) without a reset or a done.
        no_done_at_end: never write done (nor terminated); episode ends keep `truncated`.
        count_steps_by: what `frames_per_batch`, `total_frames` and `frames` count: "env_steps"
            or "agent_steps" (RLlib's: with 3 agents acting at every step, 300 agent steps
            are 100 env steps).
        compact_obs: TorchRL's: leave the `("next", <observation>)` entries out of batches
            (the env's observations and state; `("next", "reward")` and the done flags stay);
            the batch keeps its `[*env_batch, T]` layout, and TorchRL's
            `NextStateReconstructor` rebuilds them from a replay buffer's samples (see
            `rlcollect/batch/next_observations.py`).
        store_obs_once: ours: store every observation once, losslessly: batches of batch size
            `[*env_batch]` with `T + 1` observations per env and the final observations of
            episodes ending inside the batch; `transition_view(batch)` gives the standard
            layout back (see `rlcollect/batch/compact.py`). `collect_rollout` still fills its
            rollout in full.
        policies: RLlib's one policy per team, `{policy_id: policy}` (instead of `policy`):
            each is called once per step on all the agents `policy_mapping_fn(agent_id)`
            sends it, and batches hold one sub-batch per policy id (see `PolicyMap`).
        policy_mapping_fn: agent id -> policy id (may be left out with a single policy).
        view_requirements: RLlib's trajectory views, `{name: ViewRequirement(...)}`, merged
            with the policy's own `view_requirements` attribute: at every step the policy reads
            e.g. `"prev_actions"` (`ViewRequirement("action", shift=-1)`) or the last 4
            observations (`shift="-3:0"`), carried across batches; they are stored in the
            batch (see `collectors/sampling/view_requirements.py`).
        backend, num_collectors, sync, backend_options: TorchRL's front door. With
            `num_collectors=N` (backend "process" by default) or `backend="process"` /
            `"ray"`, `Collector(...)` returns a `MultiSyncCollector` (`sync=True`), a
            `MultiAsyncCollector` (`sync=False`, the default) or a `RayCollector` over N copies
            of `create_env_fn` (or its list of makers), with `backend_options` merged into the
            other arguments; `"direct"` (the default) builds this class. Subclasses take none.
        inference_mode: call the policy under `torch.inference_mode` (faster than `no_grad`;
            its outputs are copied into the batch, so none of them is an inference tensor).
            Set False for a policy that keeps tensors made in `forward` on itself and
            trains through them later. Lazy layers are initialised under `no_grad` by the
            construction-time probe call; a policy left with lazy parameters keeps `no_grad`.

    Examples:
        >>> from rlcollect import Collector
        >>> collector = Collector("CartPole-v1", frames_per_batch=50, total_frames=100)
        >>> for data in collector:
        ...     print(data.batch_size, data.names)
        torch.Size([50]) ['time']
        torch.Size([50]) ['time']
        >>> collector.shutdown()
    """

    def __new__(
        cls,
        *args: Any,
        backend: str | None = None,
        backend_options: Mapping[str, Any] | None = None,
        num_collectors: int | None = None,
        sync: bool | None = None,
        **kwargs: Any,
    ) -> Collector:
        """TorchRL's front door: the multi-process or Ray collector the selector arguments
        ask for (see `single/front_door.py`), else a new `Collector`."""
        selectors = {
            "backend": backend,
            "backend_options": backend_options,
            "num_collectors": num_collectors,
            "sync": sync,
        }
        built = build_elsewhere(cls is Collector, args, kwargs, selectors)
        return super().__new__(cls) if built is None else built  # type: ignore[no-any-return]

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        device: DeviceLike = None,
        storing_device: DeviceLike = None,
        policy_device: DeviceLike = None,
        env_device: DeviceLike = None,
        create_env_kwargs: Mapping[str, Any] | None = None,
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = None,
        reset_at_each_iter: bool = False,
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        split_trajs: bool = False,
        exploration_type: InteractionType = InteractionType.RANDOM,
        return_same_td: bool = False,
        reset_when_done: bool = True,
        set_truncated: bool = False,
        replay_buffer: Any = None,
        extend_buffer: bool = True,
        track_policy_version: bool = False,
        weight_sync_schemes: Mapping[str, Any] | None = None,
        weight_recv_schemes: Mapping[str, Any] | None = None,
        worker_idx: int | None = None,
        inference_mode: bool = True,
        policy_factory: Callable[[], Any] | None = None,
        pre_collect_hook: Callable[[], None] | None = None,
        post_collect_hook: Callable[[TensorDictBase], None] | None = None,
        track_traj_ids: bool = True,
        use_buffers: bool | None = None,
        trust_policy: bool | None = None,
        auto_register_policy_transforms: bool | None = None,
        compact_obs: bool = False,
        store_obs_once: bool = False,
        batch_mode: str | None = None,
        trajs_per_batch: int | None = None,
        traj_format: str | None = None,
        trajs_per_write: int | None = None,
        soft_horizon: bool = False,
        no_done_at_end: bool = False,
        count_steps_by: str = "env_steps",
        view_requirements: Mapping[str, ViewRequirement] | None = None,
        policies: Mapping[str, Any] | None = None,
        policy_mapping_fn: Callable[[str], str] | None = None,
        compile_policy: bool | Mapping[str, Any] | None = None,
        cudagraph_policy: bool | Mapping[str, Any] | None = None,
        no_cuda_sync: bool = False,
        interruptor: Any = None,
        local_init_rb: bool | None = None,
        weight_updater: Any = None,
        backend: str | None = None,
        backend_options: Mapping[str, Any] | None = None,
        num_collectors: int | None = None,
        sync: bool | None = None,
    ) -> None:
        del backend, backend_options, num_collectors, sync  # checked by __new__
        create_env_fn = one_env_maker(create_env_fn)
        frames_per_batch, total_frames = validate_frames(frames_per_batch, total_frames)
        max_frames_per_traj = optional_frames("max_frames_per_traj", max_frames_per_traj)
        init_random_frames = optional_frames("init_random_frames", init_random_frames)
        check_loop_arguments(
            reset_when_done=reset_when_done,
            inference_mode=inference_mode,
            pre_collect_hook=pre_collect_hook,
            use_buffers=use_buffers,
            trust_policy=trust_policy,
        )
        check_torchrl_arguments(
            no_cuda_sync=no_cuda_sync,
            local_init_rb=local_init_rb,
            interruptor=interruptor,
        )
        weight_updater = check_weight_updater(weight_updater)
        self.no_cuda_sync = no_cuda_sync
        self.interruptor = interruptor
        acceleration = PolicyAcceleration.validate(compile_policy, cudagraph_policy)
        (
            self.compiled_policy,
            self.compiled_policy_kwargs,
            self.cudagraphed_policy,
            self.cudagraphed_policy_kwargs,
        ) = RequestedAcceleration.of(compile_policy, cudagraph_policy)
        self.inference_mode = inference_mode
        self._pre_collect_hook = pre_collect_hook
        policy = policy_or_map(
            policy_from_factory(policy, policy_factory), policies, policy_mapping_fn
        )
        self.options = options = BatchOptions.validate(
            postproc=postproc,
            split_trajs=split_trajs,
            return_same_td=return_same_td,
            replay_buffer=replay_buffer,
            extend_buffer=extend_buffer,
            # checked, then unused: this collector loads weights in place (it has no children)
            weight_sync_schemes=check_leaf_schemes(weight_sync_schemes),
            weight_recv_schemes=weight_recv_schemes,
            reset_at_each_iter=reset_at_each_iter,
            post_collect_hook=post_collect_hook,
            track_traj_ids=track_traj_ids,
            compact_obs=compact_obs,
            store_obs_once=store_obs_once,
        )
        env = register_policy_transforms(
            make_env(create_env_fn, create_env_kwargs), policy, auto_register_policy_transforms
        )
        refuse_options_needing_one_buffer(
            env,
            split_trajs=split_trajs,
            compact_obs=compact_obs,
            store_obs_once=store_obs_once,
            max_frames_per_traj=max_frames_per_traj,
            batch_mode=batch_mode,
            trajs_per_batch=trajs_per_batch,
        )
        self.devices = DeviceSplit.resolve(
            env_own_device=env.device,
            device=device,
            env_device=env_device,
            policy_device=policy_device,
            storing_device=storing_device,
        )
        options.run_first(bind_policy_map(policy, env))
        # The policy reads the env's own observations, not the step count a limit adds.
        observation_keys = env.observation_keys
        sampling = Sampling.build(
            env,
            max_frames_per_traj=max_frames_per_traj,
            soft_horizon=soft_horizon,
            no_done_at_end=no_done_at_end,
            set_truncated=set_truncated,
            episode_options={
                "batch_mode": batch_mode,
                "trajs_per_batch": trajs_per_batch,
                "traj_format": traj_format,
                "trajs_per_write": trajs_per_write,
            },
            frames_per_batch=frames_per_batch,
            has_buffer=replay_buffer is not None,
            return_same_td=return_same_td,
            reset_at_each_iter=reset_at_each_iter,
            split_trajs=split_trajs,
        )
        refuse_interruptor_with_whole_episodes(interruptor, sampling)
        self.stepped_env, self.horizon = sampling.env, sampling.horizon
        self.worker_idx = worker_idx
        self.exploration_type = exploration_type
        self.set_truncated = set_truncated
        self.track_policy_version = track_policy_version
        geometry = BatchGeometry.of(self.stepped_env, frames_per_batch, count_steps_by)
        self.frames_per_step = geometry.frames_per_step
        self.steps_per_batch = geometry.steps_per_batch
        self.frames_per_batch = geometry.frames_per_batch
        self.total_frames = self._round_total("total_frames", total_frames)
        self.init_random_frames = self._round_total("init_random_frames", init_random_frames or 0)
        # The env was reset into the carrier's slot T, where a batch starts from; its
        # trajectories get their ids when the first batch starts them.
        self.stream = TrajectoryStream()
        self._build_loop(
            policy, observation_keys, view_requirements, sampling, soft_horizon, acceleration
        )
        self._background = BackgroundLoop(self._background_batch)
        self._rollout_storage: RolloutStorage | None = None
        self.frames = 0
        self.iterations = 0
        self._start_time: float | None = None
        self._frames_at_start = 0
        self._profiler: RolloutProfiler | None = None
        self._model_senders = ModelSenders(weight_sync_schemes)
        self._connect_model_senders()
        self._adopt_scheme_receivers()
        self._adopt_weight_updater(weight_updater)

    def _connect_model_senders(self) -> None:
        """Set the schemes of models other than the policy up as senders, now that the
        collector they may read is built; a failure closes the env before it is raised."""
        try:
            self._model_senders.connect(self)
        except BaseException:
            self.shutdown(raise_on_error=False)
            raise

    def _build_loop(
        self,
        policy: Any,
        observation_keys: list[Any],
        view_requirements: Mapping[str, ViewRequirement] | None,
        sampling: Sampling,
        cut_on_truncated: bool,
        acceleration: PolicyAcceleration,
    ) -> None:
        """The policy on its device, the carrier with the trajectory views, the per-step
        callables, and the assembler of whole episodes."""
        views = TrajectoryViews.resolve(view_requirements, policy, self.stepped_env)
        if views is not None:
            self.options.run_first(views.batch_steps())
            observation_keys = [*observation_keys, *views.input_keys]  # a forward may name them
        action_keys = list(self.stepped_env.action_keys)
        lend_exploration_spec(policy, self.stepped_env)  # before: the holder may copy the policy
        self.policy_holder = PolicyHolder(
            policy,
            observation_keys,
            self.devices.policy,
            action_keys,
            acceleration,
            device_is_explicit=self.devices.policy_is_explicit,
        )
        lend_action_spec(policy, self.stepped_env)  # after: the holder draws random actions for it
        # Envs whose entries differ in shape (heterogeneous agents, dynamic specs) stack one
        # TensorDict a step; every other env keeps the dense, preallocated carrier. The
        # stacked layout has the methods the loop and the collector call (duck-typed).
        dense = fits_one_buffer(self.stepped_env)
        layout_class = CarrierLayout if dense else StackedCarrierLayout
        self.layout = layout_class.build(  # type: ignore[assignment]
            self.stepped_env,
            self.policy_holder,
            self.steps_per_batch,
            self.devices,
            self.track_policy_version,
            cut_on_truncated=cut_on_truncated,
            views=views,
        )
        mode = sampling.episode_mode
        self._whole_episodes = (
            None
            if mode is None
            else EpisodeAssembler(mode, end_flag_keys(self.stepped_env.done_keys))
        )
        if dense and self.policy_holder.module is not None and len(action_keys) == 1:
            warn_if_action_misfits(
                self.stepped_env.full_action_spec[action_keys[0]],
                self.layout.carrier.get(action_keys[0]),
                len(self.stepped_env.batch_size),
                action_keys[0],
            )
        if self._whole_episodes is not None:  # cut by a reset: they never end
            self.stream.on_reset.append(self._whole_episodes.drop_running)
        flags = LoopFlags(
            reset_at_each_iter=self.options.reset_at_each_iter,
            set_truncated=self.set_truncated,
            no_done_at_end=self.horizon.no_done_at_end,
            exploration_type=self.exploration_type,
            inference_mode=self.inference_mode,
            interruptor=self.interruptor,
        )
        self.loop = RolloutLoop(
            self.stepped_env,
            self.layout,
            self.policy_holder,
            self.steps_per_batch,
            self.stream,
            flags,
        )

    def _round_total(self, argument: str, frames: int) -> int:
        return round_to_batches(argument, frames, self.frames_per_batch, 3)

    # --- one batch (the loop itself is rollout.py's) -------------------------------------------

    def _collect(
        self, stop: Callable[[], bool] | None = None, loop: RolloutLoop | None = None
    ) -> None:
        """Fill the carrier of `loop` (the collector's own by default) with one batch and
        count it; a batch abandoned by `stop` is not counted (see `RolloutLoop.collect`)."""
        if self._start_time is None:
            self._start_time = time.perf_counter()
        if self._pre_collect_hook is not None:
            self._pre_collect_hook()
        self._poll_weight_schemes()
        (loop or self.loop).collect(self.frames < self.init_random_frames, stop)
        self.frames += self.frames_per_batch
        self.iterations += 1

    def _deliver(self) -> TensorDictBase:
        if self.options.store_once_at_delivery:
            return self._process(self._device_as_asked(self._compact_batch()))
        return self._process(self._device_as_asked(self._raw_batch()))

    def _device_as_asked(self, batch: TensorDictBase) -> TensorDictBase:
        """`batch` carrying `storing_device` (or `device`) when one was given, and no device
        otherwise, as TorchRL's batches (its tensors stay where the env wrote them)."""
        if self.devices.storing_is_explicit or batch.device is None:
            return batch
        if self.options.return_same_td:
            return batch.clear_device_()  # the same batch every time (a view of the rollout)
        return batch.clone(recurse=False).clear_device_()

    def _compact_batch(self) -> TensorDictBase:
        """The batch just collected, compact: each observation copied once from the carrier
        (no full copy first)."""
        crosses = self.devices.storing_crosses
        view = self.layout.with_extras(self.layout.batch_view.copy())
        batch = compact_batch(view, copy=not crosses)
        return batch.to(self.devices.storing) if crosses else batch

    def _raw_batch(self) -> TensorDictBase:
        """The batch just collected, as stored (a copy, unless `return_same_td`); with
        `compact_obs`, the `("next", <observation>)` entries are not copied."""
        batch = self.layout.batch_view
        if self.options.drop_next_observations:
            batch = drop_next_observations(batch)
        if self.devices.storing_crosses:
            batch = batch.to(self.devices.storing)
        elif not self.options.return_same_td:
            batch = batch.clone()
        if batch.device is None and self.devices.storing_is_explicit:
            batch = batch.to(self.devices.storing)  # a device-less env's batch, device given
        return self.layout.with_extras(batch)

    def fake_tensordict(self) -> TensorDictBase:
        """A zero-filled batch shaped and keyed as the batches this collector yields
        (TorchRL's): the env's, the policy's and the collector's keys over `[*B, T]` ("time"
        last), after `compact_obs`, `split_trajs`, `postproc` and the private keys' removal;
        the post-collect hook is not called. Nothing is collected, so a storage or a compiled
        model can be set up before the first batch."""
        batch = self.layout.with_extras(self.layout.batch_view).clone().zero_()
        if self.options.drop_next_observations:
            batch = drop_next_observations(batch)
        for process in self.options.pipeline:
            if not isinstance(process, CollectHook):
                batch = process(batch)
        return batch

    def _process(self, batch: TensorDictBase) -> TensorDictBase:
        """`batch` through the pipeline (split_trajs, postproc, private keys, hooks)."""
        for process in self.options.pipeline:
            batch = process(batch)
        return batch

    def collect(self, num_steps: int, rollout: TensorDictBase) -> TensorDictBase:
        """Collect one batch straight into `rollout`, in place, and return it.

        `rollout` is a `[*env.batch_size, T + 1]` TensorDict in the buffer layout of
        `RolloutBuffer(num_envs, rollout_len, obs_dim, action_dim)` or in the TorchRL layout
        (`rlcollect/batch/rollout_layout.py`). The collector writes its `T` steps through the
        loop of `next()`, the observation the next rollout starts from at slot `T` and, when
        the policy writes `"state_value"`, its bootstrap value there and `final_value`; never
        the fields an algorithm attaches (see `single/rollout_storage.py`).

        Args:
            num_steps: `T`; must be the rollout's and this collector's steps per batch.
            rollout: the rollout to fill, e.g. `RolloutBuffer.start_rollout()`.

        Raises:
            StopIteration: when `total_frames` have been collected.
            ValueError: `num_steps` is not the rollout's `T` or the collector's steps per
                batch, or an entry of the rollout does not fit (each naming both sides).
        """
        frames_per_step = self.frames_per_batch // self.steps_per_batch  # the whole env batch
        check_num_steps(num_steps, rollout, self.steps_per_batch, frames_per_step)
        return self._fill_rollout(rollout, "collect()", bootstrap=True)

    def collect_rollout(self, rollout: TensorDictBase) -> TensorDictBase:
        """Collect one batch straight into `rollout` and return it (no intermediate batch).

        `rollout` is a `[*env.batch_size, T + 1]` TensorDict such as
        `RolloutBuffer.start_rollout()`: the collector writes its `[..., :T]` transitions and
        the next observation at slot `T` (where the following rollout starts). Keys it lacks
        are added to it once (TorchRL layout); entries of another dtype or device are copied
        in after the loop. Counts towards `total_frames` like a yielded batch. The collector
        writes into `rollout` only during this call. `collect` also writes the bootstrap value.

        Raises:
            StopIteration: when `total_frames` have been collected.
            ValueError: when `rollout` has the wrong batch size, or an entry of the wrong
                shape.
        """
        return self._fill_rollout(rollout, "collect_rollout()", bootstrap=False)

    def _fill_rollout(
        self, rollout: TensorDictBase, action: str, *, bootstrap: bool
    ) -> TensorDictBase:
        self._check_idle(action)
        if self._whole_episodes is not None:
            raise MisuseError(
                f"{action} fills a fixed [N, T + 1] rollout; it cannot hold batches of whole "
                "episodes (batch_mode / trajs_per_batch)."
            )
        if self.is_done:
            raise StopIteration
        own, storage = self.layout, self._rollout_storage
        if storage is None or storage.rollout is not rollout:
            # the binding validates rollout before anything changes
            storage = self._rollout_storage = RolloutStorage(rollout, own, self.loop)
        storage.layout.carry_from(own)
        try:
            self._collect(loop=storage.loop)
        finally:
            own.carry_from(storage.layout)
        storage.finish(bootstrap=bootstrap)
        return rollout

    def _background_batch(self) -> bool:
        """One batch of `start()`: False ends the thread (done, or abandoned at shutdown)."""
        try:
            return self._collect_into_buffer(stop=self._background.stop_requested)
        except BatchAbandonedError:
            return False

    def _collect_into_buffer(self, stop: Callable[[], bool] | None = None) -> bool:
        """Collect one batch and extend the buffer with a copy of it (a buffer may keep what
        it is given, e.g. a list storage). Returns whether collection goes on."""
        if self.is_done:
            return False
        self._collect(stop)
        try:
            if self._whole_episodes is None:
                self.options.buffer_writer.extend(self._deliver())
            else:
                self._whole_episodes.add(self._raw_batch())
                for run in self._whole_episodes.take_writes():
                    self.options.buffer_writer.extend(self._process(run))
        except BaseException:
            # Not stored, so not counted; the next batch starts a new trajectory from a reset
            # rather than leaving a hole inside one.
            self.frames -= self.frames_per_batch
            self.iterations -= 1
            self.stream.needs_reset = True
            raise
        return not self.is_done

    @property
    def _frames_reached(self) -> bool:
        return 0 < self.total_frames <= self.frames

    @property
    def is_done(self) -> bool:
        """Whether `total_frames` have been collected (and, with whole episodes, no whole
        batch of them is left to yield)."""
        if not self._frames_reached:
            return False
        assembler = self._whole_episodes
        no_batch_left = assembler is None or not assembler.has_batch()
        return no_batch_left or self.options.replay_buffer is not None

    @property
    def yields_whole_episodes(self) -> bool:
        return self._whole_episodes is not None

    @property
    def traj_format(self) -> str | None:
        """The layout of `trajs_per_batch`'s batches, "padded" or "cat" (TorchRL's); None
        without `trajs_per_batch`."""
        assembler = self._whole_episodes
        return None if assembler is None or assembler.mode.count is None else assembler.mode.layout

    # --- iteration ------------------------------------------------------------------------------

    def next(self) -> TensorDictBase | None:
        """Collect and return one batch (None when filling a replay buffer).

        Raises:
            StopIteration: when `total_frames` have been collected.
        """
        self._check_idle("next()")
        if self.is_done:
            raise StopIteration
        if self.options.replay_buffer is not None:
            self._collect_into_buffer()
            return None
        assembler = self._whole_episodes
        if assembler is None:
            self._collect()
            return self._deliver()
        while not assembler.has_batch():
            if self._frames_reached:
                raise StopIteration  # what still runs is incomplete
            self._collect()
            assembler.add(self._raw_batch())
        return self._process(assembler.take_batch())

    # --- background collection ------------------------------------------------------------------

    def start(self) -> None:
        """Collect in a background thread that extends the replay buffer until shut down."""
        if self.options.replay_buffer is None:
            raise RuntimeError(
                "start() fills a replay buffer; pass replay_buffer=... to the Collector."
            )
        self._background.start()

    def pause(self) -> AbstractContextManager[None]:
        """Context manager: no batch is collected or written while it is active."""
        return self._background.pause()

    def async_shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop background collection and release the env.

        Returns once the thread has ended or after `timeout` seconds, whichever comes first.
        A batch being collected is abandoned at its next step: it is neither written nor
        counted (so `frames` stays equal to what reached the buffer), and collection would
        restart from a reset. A batch already collected is written whole before the thread
        ends. The env is closed only if the thread has ended.
        """
        try:
            self._background.shutdown(timeout)
        finally:
            if close_env and not self._background.is_running:
                self.stepped_env.close()

    def _shut_down(self, timeout: float | None, close_env: bool) -> None:
        """Stop any background collection and close the env."""
        self.async_shutdown(timeout, close_env=close_env)

    def __repr__(self) -> str:
        return (
            f"Collector(env={self.stepped_env!r}, frames_per_batch={self.frames_per_batch}, "
            f"total_frames={self.total_frames}, frames={self.frames})"
        )

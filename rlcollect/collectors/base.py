"""`CollectorBase`: the contract every collector keeps, wherever its loop runs.

A collector in this process (`single/`), one over worker processes (`multiprocess/`) and one
over Ray actors (`ray/`) all answer the same calls, so that a parent can drive any of them as
a child and a user can swap one for another:

* iteration: `next()`, `for data in collector`, `len()`, `with collector:`, `shutdown()`;
* weights: `update_policy_weights_` (written once, here) checks the arguments and hands the
  update to `_update_weights`; `apply_weights(weights, version, timeout, worker_ids)` loads
  weights a parent already validated, as policy version `version`, and returns once every
  child below has acknowledged; `policy_version` counts updates;
* state: `state_dict()` / `load_state_dict()` (counters go on, no trajectory id is reused),
  `set_seed(seed)` (returns the next free seed), `reset()` (the next batch starts from a
  reset), `assign_trajectory_ids(offset, stride)` (a parent gives each child its own ids);
* statistics: `stats()` (frames, batches, frames/s, episode returns);
* episodes: `sample(num_timesteps=..., num_episodes=...)` (written once, here, on top of
  `next()`) hands the batches out as RLlib's EnvRunner does, as `Episode`s and chunks of them.

The worker protocol (`multiprocess/worker.py`'s commands) and the Ray actor's methods
(`ray/actor.py`) are this contract carried over a pipe or a Ray call.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from tensordict import TensorDictBase

from rlcollect.collectors.attribute_path import resolve_attribute_path
from rlcollect.collectors.legacy_updater import check_weight_updater, register
from rlcollect.collectors.sampling.episode_sampler import (
    EpisodeSampler,
    SampledEpisode,
    check_sample_arguments,
)
from rlcollect.collectors.scheme_receivers import SchemeReceivers, sets_itself_up
from rlcollect.collectors.torchrl_abc import register_as_torchrl_collectors
from rlcollect.errors import MisuseError

POLICY_MODEL_ID = "policy"


def one_weights_source(
    policy_or_weights: Any,
    weights: Any,
    policy: Any,
    weights_dict: Mapping[str, Any] | None = None,
    model_id: str | None = None,
    method: str = "update_policy_weights_",
) -> Any:
    """The one of TorchRL's ways of passing weights that was used (None: none was):
    positionally, `weights=`, `policy=`, or `weights_dict={model_id: weights}`; `model_id`
    names the model they are for. Here the policy's only (`"policy"`): `receive_weights` and
    receive schemes carry the policy; `update_policy_weights_` reads other models' weights
    with `weights_by_model`.

    Raises:
        ValueError: more than one was given, naming them; a model id other than "policy".
    """
    for model in [model_id, *(weights_dict or {})]:
        if model not in (None, POLICY_MODEL_ID):
            raise ValueError(
                f"{method} got model id {model!r}; rlcollect collectors sync one model, "
                f"{POLICY_MODEL_ID!r}. Put other networks' weights in the policy, or update "
                "them in place yourself."
            )
    if weights_dict is not None and not isinstance(weights_dict, Mapping):
        raise TypeError(
            f"weights_dict must map model ids to weights, e.g. {{'policy': weights}}; got "
            f"{type(weights_dict).__name__}."
        )
    given = {
        name: value
        for name, value in (
            ("policy_or_weights", policy_or_weights),
            ("weights", weights),
            ("policy", policy),
            ("weights_dict", (weights_dict or {}).get(POLICY_MODEL_ID)),
        )
        if value is not None
    }
    if len(given) > 1:
        raise ValueError(
            f"{method} takes one of policy_or_weights, weights and policy; got "
            f"{sorted(given)} (weights_dict={{'policy': ...}} counts as one of them too)."
        )
    return next(iter(given.values()), None)


def weights_by_model(
    policy_or_weights: Any,
    weights: Any,
    policy: Any,
    weights_dict: Mapping[str, Any] | None,
    model_id: str | None,
) -> tuple[bool, Any, dict[str, Any]]:
    """What `update_policy_weights_` was asked to update, with TorchRL's rules: whether the
    policy is updated, its weights (None: read again), and the weights of every other model
    by model id (an attribute path, e.g. `"env.transform[0].module"`).

    Raises:
        ValueError: `weights_dict` together with `model_id` or with weights, more than one
            source, or no weights for a model other than the policy.
        TypeError: `weights_dict` is no mapping, or a model id is no string.
    """
    if weights_dict is not None:
        if not isinstance(weights_dict, Mapping):
            raise TypeError(
                "weights_dict must map model ids to weights, e.g. {'policy': weights, "
                f"'env.transform[0].module': value_weights}}; got {type(weights_dict).__name__}."
            )
        if model_id is not None:
            raise ValueError(
                f"update_policy_weights_ got weights_dict and model_id={model_id!r}; pass one: "
                "weights_dict names the model of each weights itself."
            )
        sources = [policy_or_weights, weights, policy]
        if any(source is not None for source in sources):
            raise ValueError(
                "update_policy_weights_ got weights_dict and weights (policy_or_weights, "
                "weights= or policy=); put every model's weights in weights_dict."
            )
        requested = dict(weights_dict)
    else:
        source = one_weights_source(policy_or_weights, weights, policy)
        requested = {model_id if model_id is not None else POLICY_MODEL_ID: source}
    for name, source in requested.items():
        if not isinstance(name, str):
            raise TypeError(f"model ids are strings ('policy' or an attribute path); got {name!r}.")
        if name != POLICY_MODEL_ID and source is None:
            raise ValueError(
                f"update_policy_weights_ got no weights for model {name!r}; only the policy's "
                "are read again from the policy this collector was given. Pass the weights."
            )
    has_policy = POLICY_MODEL_ID in requested
    policy_source = requested.pop(POLICY_MODEL_ID, None)
    return has_policy, policy_source, requested


# TorchRL's names for collector classes ("single", "sync", "async"), which its
# `collector_class` arguments take: each class registers its own (`torchrl_shorthand=`).
COLLECTOR_SHORTHANDS: dict[str, type] = {}


class CollectorBase:
    """The contract every collector keeps (see the module docstring); iteration and
    `update_policy_weights_` are written here once, on top of the rest."""

    def __init_subclass__(cls, torchrl_shorthand: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if torchrl_shorthand is not None:
            COLLECTOR_SHORTHANDS[torchrl_shorthand] = cls

    # Whether the class is built from one env maker per worker of its own (a list): a parent
    # that runs it as a child (RayCollector's actors) then hands it a list, as TorchRL's does.
    takes_env_maker_list: bool = False

    frames: int
    total_frames: int
    frames_per_batch: int
    options: Any  # the validated batch options (collectors/options.py's BatchOptions)
    policy_version: int  # updates of the policy weights (or `increment_version()` calls)
    # how long the last update_policy_weights_ took, acknowledgements included (its stats())
    weight_update_seconds: float = float("nan")
    _weight_updater: Any = None
    _in_weight_updater: bool = False

    @property
    def weight_updater(self) -> Any:
        """TorchRL's legacy `WeightUpdaterBase`, when one was given (`weight_updater=`, or
        set here: this collector registers with it); `update_policy_weights_` then hands
        updates to it (see `collectors/legacy_updater.py`). None by default."""
        return self._weight_updater

    @weight_updater.setter
    def weight_updater(self, value: Any) -> None:
        self._weight_updater = register(check_weight_updater(value), self)

    def _adopt_weight_updater(self, weight_updater: Any) -> None:
        """Register with `weight_updater=` once the collector is built; a failure shuts the
        collector down (its workers included) before it is raised."""
        if weight_updater is None:
            return
        try:
            self.weight_updater = weight_updater
        except BaseException:
            self.shutdown()
            raise

    # --- weights ----------------------------------------------------------------------------------

    def update_policy_weights_(
        self,
        policy_or_weights: Any = None,
        *,
        weights: Any = None,
        policy: Any = None,
        worker_ids: int | Sequence[int] | None = None,
        timeout: float | None = None,
        policy_id: str | None = None,
        model_id: str | None = None,
        weights_dict: Mapping[str, Any] | None = None,
    ) -> None:
        """Load new policy weights where the policy runs, and wait until they are in use.

        Weights come as a module, a state dict or a TensorDict of parameters, positionally
        or as `weights=` / `policy=` (one of them, as in TorchRL), for the model `model_id`
        (default `"policy"`), or as `weights_dict={model_id: weights}` for several models at
        once. A model id other than `"policy"` is an attribute path on the collector that
        runs the env (e.g. `"env.transform[0].module"`, a value network inside an env
        transform), as TorchRL resolves it in a worker; its weights are checked against that
        module's names, shapes and dtypes before anything is loaded (on a Ray actor, there),
        and loaded before the policy's (`policy_version` counts the policy's updates only).
        With no weights, the policy's are read again from the policy this collector was
        given, so that `update_policy_weights_()` after an optimiser step on it is enough.
        With `policies=`, `policy_id` addresses one policy: the weights are its own, and the
        other policies keep theirs.

        A collector with children (worker processes, Ray actors) checks the weights against
        the policy's names, shapes and dtypes before anything is sent, sends them to
        `worker_ids` (None: every child) and returns once every child of the tree has
        applied them, within `timeout` seconds (30 by default); the next batch of every leaf
        is then produced by them and reports the new `policy_version`. A `Collector` loads
        them in place (it has no children: `worker_ids` and `timeout` are unused).

        Raises:
            ValueError: more than one source, `weights_dict` with `model_id` or weights, a
                missing or extra key, or a tensor of the wrong shape or dtype.
            KeyError: a model id that names nothing on the collector that runs the env.
            WorkerError / ActorError: a child did not acknowledge within `timeout` seconds
                (the error names its path, e.g. `worker 1 -> worker 0`) or failed.
        """
        if self._weight_updater is not None and not self._in_weight_updater:
            self._update_through_updater(
                one_weights_source(policy_or_weights, weights, policy),
                worker_ids,
                model_id=model_id,
                weights_dict=weights_dict,
                policy_id=policy_id,
            )
            return
        has_policy, source, models = weights_by_model(
            policy_or_weights, weights, policy, weights_dict, model_id
        )
        started = time.perf_counter()
        if models:
            self._update_models(models, worker_ids, timeout)
        if has_policy:
            self._update_weights(source, policy_id, worker_ids, timeout)
        self.weight_update_seconds = time.perf_counter() - started

    def _update_through_updater(
        self,
        source: Any,
        worker_ids: Any,
        *,
        model_id: str | None,
        weights_dict: Mapping[str, Any] | None,
        policy_id: str | None,
    ) -> None:
        """Hand an update to the legacy weight updater (TorchRL's path when one is set);
        `update_policy_weights_` called inside it takes our own path."""
        if model_id not in (None, POLICY_MODEL_ID) or weights_dict is not None or policy_id:
            raise ValueError(
                "update_policy_weights_ with a weight_updater pushes the policy's weights only "
                f"(as TorchRL's legacy updater); got model_id={model_id!r}, "
                f"weights_dict={'given' if weights_dict is not None else None}, "
                f"policy_id={policy_id!r}. Pass weight_sync_schemes instead of weight_updater "
                "to update other models."
            )
        started = time.perf_counter()
        self._in_weight_updater = True
        try:
            self._weight_updater(policy_or_weights=source, worker_ids=worker_ids)
        finally:
            self._in_weight_updater = False
        self.weight_update_seconds = time.perf_counter() - started

    def _update_models(
        self, models: dict[str, Any], worker_ids: Any, timeout: float | None
    ) -> None:
        """Load the weights of models other than the policy, by model id (an attribute path
        on the collector that runs the env), checked first; every child acknowledges."""
        raise ValueError(
            f"{type(self).__name__} updates the policy's weights only; got model ids "
            f"{sorted(models)}. Collector, MultiSyncCollector, MultiAsyncCollector and "
            "RayCollector update other models too (weights_dict={'policy': ..., "
            "'env.transform[0].module': ...}); here, put the other networks' weights in the "
            "policy."
        )

    def _update_weights(
        self, source: Any, policy_id: str | None, worker_ids: Any, timeout: float | None
    ) -> None:
        raise NotImplementedError

    def apply_weights(
        self,
        weights: Any,
        version: int,
        timeout: float | None = None,
        worker_ids: int | Sequence[int] | None = None,
    ) -> None:
        """Load weights a parent already validated, as policy version `version`, and return
        once every child below has acknowledged (what a parent's update calls in a child)."""
        raise NotImplementedError

    def receive_weights(
        self, policy_or_weights: Any = None, *, weights: Any = None, policy: Any = None
    ) -> None:
        """TorchRL's `receive_weights`: apply weights to this collector's policy.

        With no argument, the weights the receive schemes hold (`weight_recv_schemes`,
        `register_scheme_receiver`) are applied; without schemes, the weights of the policy
        this collector was given are read again (as `update_policy_weights_()`). Given
        weights (a module, a TensorDict or a dict, positionally or as `weights=` /
        `policy=`) are applied as `update_policy_weights_` applies them.

        Raises:
            ValueError: more than one source, or weights given while receive schemes are
                registered (they are the source then).
        """
        source = one_weights_source(policy_or_weights, weights, policy, method="receive_weights")
        schemes = [*self.options.weight_recv_schemes, *self._scheme_receivers.schemes]
        if source is not None and schemes:
            raise ValueError(
                f"receive_weights got weights, but this collector receives them from its "
                f"schemes {sorted(schemes)}; call receive_weights() with no argument."
            )
        if source is None and schemes:
            self._scheme_receivers.receive()
            self._receive_from_schemes()
        else:
            self._update_weights(source, None, None, None)

    @property
    def _scheme_receivers(self) -> SchemeReceivers:
        """TorchRL's schemes this collector receives through (see `scheme_receivers.py`)."""
        receivers = self.__dict__.get("_scheme_receivers_held")
        if receivers is None:
            receivers = self.__dict__["_scheme_receivers_held"] = SchemeReceivers()
        return receivers

    @property
    def _receiver_schemes(self) -> dict[str, Any]:
        """TorchRL's name for them, which its remote calls address (e.g.
        `cascade_execute("_receiver_schemes['policy'].receive")`)."""
        return self._scheme_receivers.schemes

    def _receive_weights_scheme(self, model_version: int | None = None) -> None:
        """Receive through TorchRL's schemes now (what TorchRL's `RPCCollector` calls on its
        node's collector as it sends): each loads the weights and passes them on with
        `update_policy_weights_`; `model_version`, when given, is the version then held."""
        self._scheme_receivers.receive()
        if model_version is not None:
            self.policy_version = int(model_version)

    def _receive_from_schemes(self) -> None:
        """Apply what every receive scheme holds (before every batch, and on request)."""
        for scheme in self.options.weight_recv_schemes.values():
            received = scheme.receive()
            if received is not None:
                self._update_weights(received, None, None, None)

    def register_scheme_receiver(
        self, weight_recv_schemes: Mapping[str, Any], *, synchronize_weights: bool = True
    ) -> None:
        """Add receive schemes (`{"policy": scheme}`).

        A scheme with a `receive()` that returns weights or None is polled before every
        batch, as `weight_recv_schemes=` ones are; with `synchronize_weights`, what it holds
        is applied now. One of TorchRL's (`init_on_receiver`) is set up on this collector
        first, as TorchRL does, then connected (with `synchronize_weights`); its sender
        drives it from then on (see `scheme_receivers.py`).

        Raises:
            ValueError: a model id other than "policy".
            TypeError: a scheme without `receive()`.
            RuntimeError: a TorchRL scheme already set up as a sender.
        """
        polled: dict[str, Any] = {}
        driven: dict[str, Any] = {}
        for model_id, scheme in dict(weight_recv_schemes).items():
            one_weights_source(None, None, None, model_id=model_id, method="weight_recv_schemes")
            if not callable(getattr(scheme, "receive", None)):
                raise TypeError(
                    f"weight_recv_schemes[{model_id!r}] must have a receive() method returning "
                    f"weights or None; got {type(scheme).__name__}."
                )
            (driven if sets_itself_up(scheme) else polled)[model_id] = scheme
        worker_idx = getattr(self, "worker_idx", None)
        self._scheme_receivers.add(driven, self, worker_idx)
        self.options.weight_recv_schemes = {**self.options.weight_recv_schemes, **polled}
        if synchronize_weights:
            self._scheme_receivers.connect(worker_idx)
            self._receive_from_schemes()

    def _adopt_scheme_receivers(self) -> None:
        """Take TorchRL's schemes given as `weight_recv_schemes=` out of the polled ones and
        set them up on this collector, now that it is built (TorchRL's order); a failure
        shuts the collector down before it is raised."""
        given = self.options.weight_recv_schemes
        driven = {model_id: scheme for model_id, scheme in given.items() if sets_itself_up(scheme)}
        if not driven:
            return
        self.options.weight_recv_schemes = {
            model_id: scheme for model_id, scheme in given.items() if model_id not in driven
        }
        try:
            self.register_scheme_receiver(driven)
        except BaseException:
            self.shutdown(raise_on_error=False)
            raise

    def init_updater(self, *args: Any, **kwargs: Any) -> None:
        """TorchRL's `init_updater`: initialise the legacy weight updater. rlcollect has none
        (weights travel by `update_policy_weights_` and schemes), and TorchRL does nothing
        when none is set: a no-op."""

    def get_policy_version(self) -> int:
        """`policy_version`, as a method (TorchRL's, for remote calls)."""
        return self.policy_version

    def increment_version(self) -> None:
        """Count one more policy version without sending weights (TorchRL's): the next
        update goes on from it. A collector with children counts it here only; the frames
        its children collect report the version of the weights they hold, as in TorchRL."""
        self.policy_version += 1

    # --- models and attributes (TorchRL's remote-friendly accessors) ----------------------------

    def get_model(self, model_id: str) -> Any:
        """The model `model_id` names: `"policy"` is the policy this collector syncs (None
        with random actions is refused); any other id is an attribute path on this
        collector (e.g. `"env.transform[0]"`), as in TorchRL.

        Raises:
            ValueError: `"policy"` on a collector of random actions.
            AttributeError / KeyError / IndexError: a path that leads nowhere.
        """
        if model_id != POLICY_MODEL_ID:
            return resolve_attribute_path(self._model_root(), model_id)
        model = self._policy_model()
        if model is None:
            raise ValueError(
                "get_model('policy'): this collector runs random actions (policy=None) or "
                "builds its policy in its children (policy_factory); it holds no policy here."
            )
        return model

    def _policy_model(self) -> Any:
        """The policy module this collector holds (None: none here)."""
        raise NotImplementedError

    def _model_root(self) -> Any:
        """What model ids other than "policy" are attribute paths on: this collector."""
        return self

    def getattr_policy(self, attr: str) -> Any:
        """An attribute of the policy (`get_model("policy")`)."""
        return getattr(self.get_model(POLICY_MODEL_ID), attr)

    @property
    def replay_buffer(self) -> Any:
        """The replay buffer this collector fills (None without one), as TorchRL names it."""
        return self.options.replay_buffer

    def getattr_rb(self, attr: str) -> Any:
        """An attribute of the replay buffer this collector fills.

        Raises:
            AttributeError: no replay buffer, or it has no `attr`.
        """
        buffer = self.options.replay_buffer
        if buffer is None:
            raise AttributeError(
                f"getattr_rb({attr!r}): this collector has no replay_buffer; build it with "
                "replay_buffer=... ."
            )
        return getattr(buffer, attr)

    def cascade_execute(self, attr_path: str, *args: Any, **kwargs: Any) -> Any:
        """Call what `attr_path` names on this collector (e.g.
        `"_receiver_schemes['policy'].receive"`), or return it when it is not callable.

        Raises:
            ValueError: arguments for something that is not callable, or a malformed path.
        """
        target = resolve_attribute_path(self, attr_path)
        if callable(target):
            return target(*args, **kwargs)
        if args or kwargs:
            raise ValueError(
                f"cascade_execute: {attr_path!r} is not callable, so it takes no arguments; "
                f"got {len(args)} positional and {sorted(kwargs)} keyword ones."
            )
        return target

    # --- state, seeds, statistics ---------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        raise NotImplementedError

    def reset(self, index: Any = None) -> None:
        raise NotImplementedError

    def assign_trajectory_ids(self, offset: int, stride: int) -> None:
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        raise NotImplementedError

    # --- iteration --------------------------------------------------------------------------------

    def next(self) -> TensorDictBase | None:
        raise NotImplementedError

    def iterator(self) -> Iterator[TensorDictBase | None]:
        """`iter(collector)`, as a method (TorchRL's)."""
        return iter(self)

    def rollout(self) -> TensorDictBase | None:
        """Collect one batch and return it: `next()` under TorchRL's name (it counts towards
        `total_frames`; None when filling a replay buffer)."""
        return self.next()

    def shutdown(
        self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = True
    ) -> None:
        """Stop collecting and release what the collector holds (env, workers, actors);
        idempotent.

        Args:
            timeout: seconds to wait for background collection to stop (None: the
                collector's own bound).
            close_env: close the env(s) too.
            raise_on_error: raise what went wrong while shutting down; False turns it into
                a warning, as TorchRL's.
        """
        try:
            self._shut_down(timeout, close_env)
            self._shut = True
        except Exception as err:
            if raise_on_error:
                raise
            warnings.warn(
                f"{type(self).__name__}.shutdown failed: {err!r}", RuntimeWarning, stacklevel=2
            )

    def _shut_down(self, timeout: float | None, close_env: bool) -> None:
        raise NotImplementedError

    _shut = False

    @property
    def closed(self) -> bool:
        """Whether `shutdown()` has run (TorchRL's `closed`: its launchers read it before
        shutting a node's collector down)."""
        return self._shut

    @property
    def is_done(self) -> bool:
        """Whether `total_frames` have been collected (never, for an endless collector)."""
        return 0 < self.total_frames <= self.frames

    def __next__(self) -> TensorDictBase | None:
        return self.next()

    def __iter__(self) -> Iterator[TensorDictBase | None]:
        while not self.is_done:
            try:
                batch = self.next()
            except StopIteration:  # e.g. whole episodes: total_frames ran out mid-episode
                return
            yield batch

    @property
    def yields_whole_episodes(self) -> bool:
        """Whether batches are whole episodes (`batch_mode="complete_episodes"`,
        `trajs_per_batch`): their count then depends on how long the episodes last."""
        return False

    def __len__(self) -> int:
        if self.yields_whole_episodes:
            raise TypeError(
                "a collector of whole episodes has no length: how many batches it yields "
                "depends on how long the episodes last."
            )
        if self.total_frames <= 0:
            raise TypeError("an endless collector (total_frames=-1) has no length.")
        return self.total_frames // self.frames_per_batch

    # --- episodes, RLlib's EnvRunner.sample() -----------------------------------------------------

    def sample(
        self, *, num_timesteps: int | None = None, num_episodes: int | None = None
    ) -> list[SampledEpisode]:
        """Collect batches and hand them out as episodes, as RLlib's `EnvRunner.sample()` does.

        The collector collects whole batches (`next()`); what a call does not hand out is
        kept for the next call, so that every collected step is handed out exactly once:

        * `num_timesteps=N`: at least N steps (env steps, summed over sub-envs, workers and
          actors): the steps kept from earlier calls, then whole batches until N are held,
          all handed out: every episode that ended, then a chunk of every running episode
          (`is_done == False`), whose continuation, with the same `id_` and
          `t_started == chunk.t`, comes with a later call. RLlib runs exactly N steps; ours
          are whole batches, and nothing collected is held back;
        * `num_episodes=K`: the first K episodes that end (batch by batch, row by row),
          each whole, or the rest of one whose first chunks an earlier call handed out (its
          `t_started` says where it resumes). RLlib resets the envs and drops what runs past
          the K episodes; here the envs go on, and the steps collected past them wait for
          the next call;
        * neither: one batch (RLlib's rollout fragment), handed out as with `num_timesteps`.

        A multi-agent env's episodes come as `AgentEpisodes` objects: one `Episode` per agent,
        keyed `(group, index)`, grouped per env episode (see `batch/multi_agent_episode.py`);
        steps count env steps.

        When `total_frames` runs out during a call, it returns what it has: the steps held
        (`num_timesteps`, neither) or the episodes that ended (`num_episodes`, fewer than K;
        the running ones stay for a `sample()` without `num_episodes`); with nothing to
        return it raises StopIteration, as `next()` does.

        Args:
            num_timesteps: how many steps to hand out at least.
            num_episodes: how many ended episodes to hand out.

        Returns:
            A list of `Episode`s (single-agent) or `AgentEpisodes` objects.

        Raises:
            ValueError: both arguments, or one below 1.
            TypeError: one is not an int.
            MisuseError: the collector fills a replay buffer (its batches go there).
            StopIteration: `total_frames` ran out and nothing is left to hand out.

        Examples:
            >>> from rlcollect import Collector
            >>> from rlcollect.testing import CountingEnv
            >>> collector = Collector(CountingEnv(episode_length=5), frames_per_batch=4)
            >>> [(e.id_, e.t_started, len(e), e.is_done) for e in collector.sample(num_timesteps=6)]
            [(0, 0, 5, True), (1, 0, 3, False)]
            >>> [(e.id_, e.t_started, len(e)) for e in collector.sample(num_episodes=1)]
            [(1, 3, 2)]
            >>> collector.shutdown()
        """
        check_sample_arguments(num_timesteps, num_episodes)
        if self.options.replay_buffer is not None:
            raise MisuseError(
                "sample() hands batches out as episodes, but this collector writes them to "
                "its replay_buffer; build it without replay_buffer=... to sample episodes."
            )
        sampler = self._episode_sampler()
        if num_episodes is not None:
            self._collect_episodes(sampler, lambda _: sampler.finished_episodes >= num_episodes)
            episodes = sampler.take_finished(num_episodes)
        else:
            steps = num_timesteps
            if steps is None:
                self._collect_episodes(sampler, lambda batches: batches >= 1)
            else:
                self._collect_episodes(sampler, lambda _: sampler.held_steps >= steps)
            episodes = sampler.take_everything()
        if not episodes:
            raise StopIteration
        return episodes

    def _episode_sampler(self) -> EpisodeSampler:
        """This collector's sampling state, made at the first `sample()`."""
        sampler: EpisodeSampler | None = getattr(self, "_sampling_state", None)
        if sampler is None:
            sampler = self._sampling_state = EpisodeSampler()
        return sampler

    def _collect_episodes(self, sampler: EpisodeSampler, enough: Callable[[int], bool]) -> None:
        """Collect batches into `sampler` until `enough(batches collected)` or the end."""
        collected = 0
        while not enough(collected) and not self.is_done:
            try:
                batch = self.next()
            except StopIteration:  # e.g. whole episodes: total_frames ran out mid-episode
                return
            if batch is None:
                raise MisuseError("sample() got no batch from next(); is a replay buffer set?")
            sampler.add(batch.clone() if self.options.return_same_td else batch)
            collected += 1

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


# TorchRL's trainers take only a `BaseCollector`: every collector of ours counts as one there.
register_as_torchrl_collectors(CollectorBase)

"""TorchRL's weight-update conventions, as every collector of ours answers them.

In: TorchRL's ways of passing weights to `update_policy_weights_` (positionally, `weights=`,
`policy=`, `weights_dict=`, `model_id=`, `worker_ids=`), a legacy `WeightUpdaterBase`
(`weight_updater=`), receive schemes registered on the collector, `init_updater`,
`increment_version`. Out: one checked call of the collector's `_update_weights(policy weights,
worker ids)` (and `_update_models` for other models), timed in `weight_update_seconds`; the
collector's `policy_version`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from rlcollect.collectors.legacy_updater import check_weight_updater, register
from rlcollect.collectors.scheme_receivers import SchemeReceivers, sets_itself_up

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


class TorchRLWeightConventions:
    """`update_policy_weights_` and the rest of TorchRL's weight calls, written once for every
    collector; a collector supplies `_update_weights` (and `_update_models`), and `shutdown`
    and `cascade_execute` (`CollectorBase`, `RemoteAccessors`)."""

    options: Any
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

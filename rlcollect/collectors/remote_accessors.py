"""TorchRL's remote-friendly accessors on every collector: a model by id, the policy's and the
replay buffer's attributes, and a method called along an attribute path.

In: a model id (`"policy"` or an attribute path such as `"env.transform[0]"`), attribute names.
Out: the object or value found there (a call's result for `cascade_execute`).
"""

from __future__ import annotations

from typing import Any

from rlcollect.collectors.attribute_path import resolve_attribute_path
from rlcollect.collectors.weight_conventions import POLICY_MODEL_ID


class RemoteAccessors:
    """`get_model`, `getattr_policy`, `replay_buffer`, `getattr_rb`, `cascade_execute`, as
    TorchRL's collectors answer them (a Ray actor or an RPC node forwards them as calls)."""

    options: Any

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

"""`SentWeights`: the policy weights a parent collector sends its workers or Ray actors.

Both parents check an update the same way before anything is sent (one of the three ways of
passing weights, against the names, shapes and dtypes of the policy's), and both keep a copy
of what their children hold: a restarted child starts from it, and an update of one policy of
a `PolicyMap` keeps the other policies' weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlcollect.collectors.policy.weights import (
    Weights,
    one_policy_weights,
    transient_names,
    validated_weights,
    weight_template,
)


class SentWeights:
    """What updates are checked against, and the weights the children hold now.

    Args:
        policy: the policy the parent was given (None with random actions or a factory).
        policy_factory: the first child's policy factory, when there is no `policy`.
    """

    def __init__(self, policy: Any, policy_factory: Callable[[], Any] | None) -> None:
        self.policy = policy
        self.template = weight_template(policy, policy_factory)
        self.transient = transient_names(policy)
        # A copy, so that in-place training of the parent's policy reaches no child before an
        # update sends it.
        self.current: Weights | None = None
        if policy is not None and self.template:
            self.record(self.template)

    @property
    def readable(self) -> bool:
        """Whether new weights can be read from the parent's own policy."""
        return self.policy is not None and bool(self.template)

    def record(self, weights: Weights) -> None:
        """Remember `weights` as what the children hold (detached copies)."""
        self.current = {name: tensor.detach().clone() for name, tensor in weights.items()}

    def checked(
        self,
        policy_or_weights: Any = None,
        weights: Any = None,
        policy: Any = None,
        policy_id: str | None = None,
    ) -> Weights:
        """The weights given (one of the three; none: read from the parent's policy),
        validated against the policy's and detached; with `policy_id`, those of one policy of
        a `PolicyMap`, merged into what the children hold.

        Raises:
            ValueError: two given, none to read, or a missing or extra key, or a tensor of the
                wrong shape or dtype.
            RuntimeError: the collector runs random actions.
        """
        given = [value for value in (policy_or_weights, weights, policy) if value is not None]
        if len(given) > 1:
            raise ValueError(
                "update_policy_weights_ takes one of policy_or_weights, weights and policy."
            )
        if not self.template:
            raise RuntimeError(
                "this collector runs random actions (policy=None); it has no weights to update."
            )
        if policy_id is not None:
            held = self.current or self.template
            return one_policy_weights(self.policy, policy_id, next(iter(given), None), held)
        source = given[0] if given else self.policy
        if source is None:
            raise ValueError(
                "update_policy_weights_() without weights reads them from the policy given at "
                "construction, but this collector was built with policy_factory; pass weights."
            )
        return validated_weights(source, self.template, self.transient)

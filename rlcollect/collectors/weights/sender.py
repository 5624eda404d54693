"""`SentWeights`: the policy weights a parent collector sends its workers or Ray actors.

Both parents check an update the same way before anything is sent (one of the three ways of
passing weights, against the names, shapes and dtypes of the policy's), and both keep a copy
of what their children hold: a restarted child starts from it, and an update of one policy of
a `PolicyMap` keeps the other policies' weights.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from rlcollect.collectors.policy.weights import (
    Weights,
    WeightsLayout,
    layout_template,
    one_policy_weights,
    transient_names,
    validated_weights,
    weight_template,
)

# Seconds `update_policy_weights_` waits for every child of the tree, by default.
UPDATE_TIMEOUT = 30.0
# A child with children of its own gets this share of its parent's timeout, so that it reports
# a silent grandchild (by path) before its parent gives up on it.
CHILD_TIMEOUT_SHARE = 0.8

Slot = TypeVar("Slot")


def check_update_timeout(timeout: float | None) -> float:
    """An update's timeout: `UPDATE_TIMEOUT` for None, else a positive number of seconds."""
    timeout = UPDATE_TIMEOUT if timeout is None else timeout
    if not timeout > 0:
        raise ValueError(f"timeout={timeout!r} must be a positive number of seconds.")
    return timeout


def select_children(slots: Sequence[Slot], worker_ids: Any, child: str) -> list[Slot]:
    """The children `worker_ids` names (an index or several, NumPy's too; None: all), or an
    error naming the index and the valid range."""
    if worker_ids is None:
        return list(slots)
    given: list[Any] = (
        [worker_ids] if isinstance(worker_ids, numbers.Integral) else list(worker_ids)
    )
    for index in given:
        if not isinstance(index, numbers.Integral) or not 0 <= int(index) < len(slots):
            raise ValueError(
                f"worker_ids has {index!r}; {child}s are numbered 0..{len(slots) - 1}."
            )
    return [slots[int(index)] for index in given]


class SentWeights:
    """What updates are checked against, and the weights the children hold now.

    Args:
        policy: the policy the parent was given (None with random actions or a factory).
        policy_factory: the first child's policy factory, when there is no `policy`.
        layout_source: with a factory only, asks a child for its policy's weights layout
            (None while no child runs); the factory is then called here only when no child
            can answer, so that it builds the policy in the children alone.
    """

    def __init__(
        self,
        policy: Any,
        policy_factory: Callable[[], Any] | None,
        layout_source: Callable[[], WeightsLayout | None] | None = None,
    ) -> None:
        self.policy = policy
        self._factory = policy_factory
        self._layout_source = layout_source
        # Learned when first needed when there is no policy here (see `template`).
        self._template: Weights | None = (
            weight_template(policy, None) if policy is not None or policy_factory is None else None
        )
        self.transient = transient_names(policy)
        self._built: Any = None  # `policy_here()`'s, with a factory only
        # A copy, so that in-place training of the parent's policy reaches no child before an
        # update sends it.
        self.current: Weights | None = None
        if policy is not None and self.template:
            self.record(self.template)

    @property
    def template(self) -> Weights:
        """The names, shapes and dtypes updates are checked against (empty: no weights). With
        a factory only, a child's layout (tensors on the meta device), or else the factory's
        policy built here, learned once, at the first need."""
        if self._template is None:
            layout = self._layout_source() if self._layout_source is not None else None
            if layout is not None:
                self._template = layout_template(layout)
            else:
                self._template = weight_template(None, self._factory)
        return self._template

    def policy_here(self) -> Any:
        """The policy given; with a factory only, one the factory builds here at the first
        call (kept): a module in this process for weights to be written into before they go
        on to the children (see `MultiCollectorBase.policy`). It is no weights source:
        updates without weights still need the policy given."""
        if self.policy is not None or self._factory is None:
            return self.policy
        if self._built is None:
            self._built = self._factory()
        return self._built

    @property
    def readable(self) -> bool:
        """Whether new weights can be read from the parent's own policy."""
        return self.policy is not None and bool(self.template)

    def record(self, weights: Weights) -> None:
        """Remember `weights` as what the children hold (detached copies)."""
        self.current = {name: tensor.detach().clone() for name, tensor in weights.items()}

    def checked(self, source: Any = None, policy_id: str | None = None) -> Weights:
        """The weights `source` (None: read from the parent's policy), validated against the
        policy's and detached; with `policy_id`, those of one policy of a `PolicyMap`, merged
        into what the children hold.

        Raises:
            ValueError: none to read, or a missing or extra key, or a tensor of the wrong
                shape or dtype.
            RuntimeError: the collector runs random actions.
        """
        if not self.template:
            raise RuntimeError(
                "this collector runs random actions (policy=None); it has no weights to update."
            )
        if policy_id is not None:
            # The other policies' weights travel too: real tensors, not a layout.
            held = self.current or weight_template(self.policy, self._factory)
            return one_policy_weights(self.policy, policy_id, source, held)
        source = self.policy if source is None else source
        if source is None:
            raise ValueError(
                "update_policy_weights_() without weights reads them from the policy given at "
                "construction, but this collector was built with policy_factory; pass weights."
            )
        return validated_weights(source, self.template, self.transient)

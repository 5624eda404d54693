"""TorchRL's weight-sync schemes on the receiving side of one of our collectors.

A scheme of TorchRL's given as a receiver (`weight_recv_schemes=`, `register_scheme_receiver`:
what TorchRL's `RPCCollector` hands the collectors it runs on its nodes) is driven by its
sender, not polled before every batch: it is set up on the receiving side first
(`init_on_receiver`, with this collector as its context), then connected; when the sender
signals (TorchRL's remote `_receive_weights_scheme`), it receives the weights into the policy
module and passes them on with the collector's `update_policy_weights_`, as in TorchRL.

Knows nothing of TorchRL's classes: such a scheme is one with `init_on_receiver`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def sets_itself_up(scheme: Any) -> bool:
    """Whether `scheme` is one of TorchRL's, set up on the receiver before it receives."""
    return callable(getattr(scheme, "init_on_receiver", None))


class SchemeContext:
    """The collector as a TorchRL scheme reads it: `policy` is the module the weights load
    into (`get_model("policy")`, the parent's copy where the children build theirs with a
    factory), and every other attribute is the collector's."""

    def __init__(self, collector: Any) -> None:
        self._collector = collector

    @property
    def policy(self) -> Any:
        try:
            return self._collector.get_model("policy")
        except ValueError:  # a policy built by a factory in the children: the parent's copy
            return self._collector.policy

    def __getattr__(self, name: str) -> Any:
        return getattr(self._collector, name)


class SchemeReceivers:
    """The TorchRL schemes a collector receives weights through, by model id."""

    def __init__(self) -> None:
        self.schemes: dict[str, Any] = {}
        # TorchRL's schemes hold their context by weak reference: the one they are given
        # lives here, or it would be gone before the first receive, and with it the call
        # that passes the weights on to the collector's workers.
        self._context: SchemeContext | None = None

    def add(self, schemes: Mapping[str, Any], collector: Any, worker_idx: int | None) -> None:
        """Set each scheme up on the receiving side (unless it is already), with `collector`
        as its context; one that replaces another under the same model id shuts it down.

        Raises:
            RuntimeError: a scheme already set up as a sender (TorchRL's rule).
        """
        if self._context is None:
            self._context = SchemeContext(collector)
        for model_id, scheme in schemes.items():
            previous = self.schemes.get(model_id)
            if previous is not None and previous is not scheme:
                previous.shutdown()
            if not scheme.initialized_on_receiver:
                if scheme.initialized_on_sender:
                    raise RuntimeError(
                        f"weight_recv_schemes[{model_id!r}] is already set up as a sender; a "
                        "scheme receives on one side only: give the receiver its own copy."
                    )
                scheme.init_on_receiver(
                    model_id=model_id, context=self._context, worker_idx=worker_idx
                )
            elif scheme.context is None:
                scheme.context = self._context
            self.schemes[model_id] = scheme

    def connect(self, worker_idx: int | None) -> None:
        """Connect every scheme not yet connected (its initial weights, where it sends any)."""
        for scheme in self.schemes.values():
            if not scheme.synchronized_on_receiver:
                scheme.connect(worker_idx=worker_idx)

    def receive(self) -> None:
        """Receive from every scheme: each loads the weights and passes them on."""
        for scheme in self.schemes.values():
            scheme.receive()

    def shutdown(self) -> None:
        for scheme in self.schemes.values():
            scheme.shutdown()

"""Weight-sync schemes that carry a model other than the policy on a transport of their own.

TorchRL registers, under a model id such as `"transform_module"`, a scheme that reaches the
model wherever it lives (e.g. `RayModuleTransformScheme`: a Ray actor that runs a module
transform), and `update_policy_weights_(weights, model_id=...)` sends through it. A collector
keeps such TorchRL schemes as they are (they are no scheme of ours to map), sets each up as
the sender once it is built, and sends that model's updates through it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tensordict import TensorDict, TensorDictBase
from torch import nn

from rlcollect.collectors.weights import torchrl_schemes
from rlcollect.collectors.weights.schemes import POLICY_MODEL_ID


class ModelSenders:
    """The TorchRL schemes of `schemes` registered under a model id other than "policy"."""

    def __init__(self, schemes: Mapping[str, Any] | None) -> None:
        self.schemes = {
            model_id: scheme
            for model_id, scheme in dict(schemes or {}).items()
            if model_id != POLICY_MODEL_ID and torchrl_schemes.is_torchrl_scheme(scheme)
        }

    def connect(self, context: Any) -> None:
        """Set every scheme up as the sender, with `context` (the collector) as TorchRL
        does, unless it already is (a module transform sets its own up)."""
        for model_id, scheme in self.schemes.items():
            if not scheme.initialized_on_sender:
                scheme.init_on_sender(model_id=model_id, context=context)
            if not scheme.synchronized_on_sender:
                scheme.connect()

    def split(self, models: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """`models` as (those a scheme here sends, the others)."""
        sent = {key: value for key, value in models.items() if key in self.schemes}
        return sent, {key: value for key, value in models.items() if key not in sent}

    def send(self, models: Mapping[str, Any], worker_ids: int | Sequence[int] | None) -> None:
        """Send each model's weights (a module, a TensorDict or a state dict) through its
        scheme; the scheme's transport says when they are in use."""
        for model_id, weights in models.items():
            self.schemes[model_id].send(weights=as_tensordict(weights), worker_ids=worker_ids)


def as_tensordict(weights: Any) -> TensorDictBase:
    """Weights as a TorchRL scheme sends them: a module's parameters and buffers, or a
    (nested or flat) state dict, as a TensorDict.

    Raises:
        TypeError: anything else.
    """
    if isinstance(weights, TensorDictBase):
        return weights
    if isinstance(weights, nn.Module):
        return TensorDict.from_module(weights)
    if isinstance(weights, Mapping):
        return TensorDict(dict(weights), batch_size=[]).unflatten_keys(".")
    raise TypeError(
        "update_policy_weights_ takes an nn.Module, a state dict or a TensorDict of "
        f"parameters; got {type(weights).__name__}."
    )

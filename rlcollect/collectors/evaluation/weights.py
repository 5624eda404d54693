"""The weights an evaluation loads: copied when it is asked for, so training goes on freely.

`evaluate()` and `trigger_eval()` take TorchRL's `weights` (a module or a TensorDict of its
parameters) and `weights_dict` (`{model_id: module or weights}`); each source is copied at
once (detached, on CPU), so an optimiser step made while a background evaluation waits or
runs never reaches it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tensordict import TensorDict, TensorDictBase
from torch import nn

from rlcollect.collectors.weights.schemes import POLICY_MODEL_ID


def extract_weights(policy: nn.Module) -> TensorDictBase:
    """A detached CPU copy of `policy`'s parameters and buffers, as a TensorDict."""
    if not isinstance(policy, nn.Module):
        raise TypeError(
            f"extract_weights takes an nn.Module; got {type(policy).__name__}. Pass the "
            "weights themselves (a TensorDict or a state dict) instead."
        )
    return TensorDict.from_module(policy).data.detach().clone().cpu()


def copied(source: Any) -> Any:
    """A detached CPU copy of one weight source: a module, a TensorDict or a state dict.

    Raises:
        TypeError: any other kind of source.
    """
    if isinstance(source, nn.Module):
        return extract_weights(source)
    if isinstance(source, TensorDictBase):
        return source.detach().clone().cpu()
    if isinstance(source, Mapping):
        return {name: tensor.detach().clone().cpu() for name, tensor in source.items()}
    raise TypeError(
        "weights must be an nn.Module, a TensorDict of parameters or a state dict; got "
        f"{type(source).__name__}."
    )


def prepared_weights(weights: Any, weights_dict: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`{model_id: copy}` of `weights_dict`, with `weights` as `"policy"` unless the dict
    has one (TorchRL's merge); None when neither gives any."""
    if weights_dict is not None and not isinstance(weights_dict, Mapping):
        raise TypeError(
            f"weights_dict must map model ids to weights; got {type(weights_dict).__name__}."
        )
    prepared = {model_id: copied(source) for model_id, source in (weights_dict or {}).items()}
    if weights is not None and POLICY_MODEL_ID not in prepared:
        prepared[POLICY_MODEL_ID] = copied(weights)
    return prepared or None

"""What a policy's weights are and how an update is checked against them: flat `{name: tensor}`
state dicts, validated by name, shape and dtype before anything is sent, and one policy's
weights addressed by id inside a `PolicyMap`.

Tensors on the meta device are no weights: they hold no data (BenchMARL's recurrent models
keep a weightless meta twin of their network, run with the weights they hold elsewhere), so
they are neither checked nor sent, and the receiving policy keeps its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from rlcollect.collectors.policy.policy_map import PolicyMap

Weights = dict[str, torch.Tensor]


def uninitialised_names(weights: Mapping[str, Any]) -> list[str]:
    """The names of the lazy parameters (e.g. `nn.LazyLinear`'s) not initialised yet."""
    return [name for name, tensor in weights.items() if nn.parameter.is_lazy(tensor)]


def _is_meta(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.is_meta


def flat_weights(weights: Any) -> Weights:
    """A module, a state dict or a TensorDict of parameters, as a flat `{name: tensor}`,
    without its meta-device entries (no data: no weights).

    Raises:
        ValueError: a module or state dict with lazy parameters not initialised yet, naming
            them: they have no shape to check or data to send.
    """
    if isinstance(weights, nn.Module):
        flat = dict(weights.state_dict())
    elif isinstance(weights, TensorDictBase):
        flat = dict(weights.flatten_keys(".").items())
    elif isinstance(weights, Mapping):
        flat = dict(weights)
    else:
        raise TypeError(
            "update_policy_weights_ takes an nn.Module, a state dict or a TensorDict of "
            f"parameters; got {type(weights).__name__}."
        )
    lazy = uninitialised_names(flat)
    if lazy:
        raise ValueError(
            f"the policy's lazy parameters {lazy} are not initialised yet, so its weights "
            "cannot be checked, copied or sent to other processes. Call the policy once on "
            "an example input (e.g. policy(env.reset())) before handing it over, give "
            "those layers their input sizes (nn.Linear instead of nn.LazyLinear), or let "
            "each worker build it (policy_factory=...)."
        )
    return {name: tensor for name, tensor in flat.items() if not _is_meta(tensor)}


def _align_prefix(names: set[str], template: set[str]) -> str | None:
    """The "module." prefix to add (or remove) so that `names` match a wrapped policy's."""
    for prefix in ("module.", "module.0.module."):
        if {prefix + name for name in names} == template:
            return "+" + prefix
        if {name.removeprefix(prefix) for name in names} == template:
            return "-" + prefix
    return None


def transient_names(policy: Any) -> frozenset[str]:
    """The names `TensorDict.from_module(policy)` has but its state dict lacks: buffers
    registered with `persistent=False`, which are no weights to send."""
    if not isinstance(policy, nn.Module):
        return frozenset()
    every = set(TensorDict.from_module(policy).flatten_keys(".").keys())
    return frozenset(every - set(policy.state_dict()))


def validated_weights(
    weights: Any,
    template: Weights,
    transient: frozenset[str] = frozenset(),
    target: str = "the policy",
) -> Weights:
    """`weights` checked against `template` (names, shapes, dtypes), detached, on CPU.

    The weights of the policy the collector was given may come as they are or as those of the
    plain module a `TensorDictModule` wraps (names without its `module.` prefix). Entries named
    in `transient` (non-persistent buffers, which `TensorDict.from_module` includes) are left
    out. `target` names what the weights are for, in errors (e.g. "model 'env.transform[0]'").

    Raises:
        ValueError: naming the missing or extra key, or the key of wrong shape or dtype.
    """
    flat = {name: value for name, value in flat_weights(weights).items() if name not in transient}
    if set(flat) != set(template):
        alignment = _align_prefix(set(flat), set(template))
        if alignment is not None:
            sign, prefix = alignment[0], alignment[1:]
            flat = {
                (prefix + name if sign == "+" else name.removeprefix(prefix)): tensor
                for name, tensor in flat.items()
            }
    missing, extra = sorted(set(template) - set(flat)), sorted(set(flat) - set(template))
    if missing or extra:
        raise ValueError(
            f"the weights do not match {target}: missing keys {missing}, unexpected keys "
            f"{extra}; expected the keys of its state_dict(): {sorted(template)}."
        )
    checked: Weights = {}
    for name, expected in template.items():
        tensor = flat[name]
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"weights[{name!r}] is a {type(tensor).__name__}, not a tensor.")
        if tensor.shape != expected.shape or tensor.dtype != expected.dtype:
            raise ValueError(
                f"weights[{name!r}] has shape {tuple(tensor.shape)} and dtype {tensor.dtype}; "
                f"{target} has shape {tuple(expected.shape)} and dtype {expected.dtype}."
            )
        checked[name] = tensor.detach()
    return checked


def weight_template(policy: Any, policy_factory: Callable[[], Any] | None) -> Weights:
    """The names, shapes and dtypes of the policy's weights (empty for random actions)."""
    source = policy if policy is not None else (policy_factory() if policy_factory else None)
    return flat_weights(source) if isinstance(source, nn.Module) else {}


def policy_by_id(policy_map: Any, policy_id: str) -> nn.Module:
    """Policy `policy_id` of `policy_map`, or an error when the collector runs one policy."""
    if not isinstance(policy_map, PolicyMap):
        raise ValueError(
            f"policy_id={policy_id!r} addresses one of several policies, but this collector "
            "runs one policy; pass policies={...} to address them by id."
        )
    return policy_map.policy(policy_id)


def one_policy_weights(
    policy_map: Any, policy_id: str, weights: Any, current: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The whole map's weights `current` (as last sent to workers), with those of `policy_id`
    replaced by `weights`, checked against them (None: read from the map's own policy).

    Raises:
        ValueError: the collector runs one policy, or the weights do not match the policy's.
        KeyError: `policy_id` is not a policy of the map.
    """
    policy = policy_by_id(policy_map, policy_id)
    prefix = f"policies.{policy_id}."
    template = {
        name.removeprefix(prefix): tensor
        for name, tensor in current.items()
        if name.startswith(prefix)
    }
    source = policy if weights is None else weights
    checked = validated_weights(source, template, transient_names(policy))
    updated = dict(current)
    updated.update({prefix + name: tensor for name, tensor in checked.items()})
    return updated


WeightsLayout = dict[str, tuple[tuple[int, ...], torch.dtype]]


def weights_layout(module: nn.Module) -> WeightsLayout:
    """The names, shapes and dtypes of a module's weights (what a child reports to its
    parent, so that the parent checks an update before sending it)."""
    return state_layout(flat_weights(module))


def state_layout(weights: Mapping[str, torch.Tensor]) -> WeightsLayout:
    """The names, shapes and dtypes of a flat state dict's tensors."""
    return {name: (tuple(t.shape), t.dtype) for name, t in weights.items()}


def layout_template(layout: WeightsLayout) -> Weights:
    """A template `validated_weights` checks against, from a `weights_layout` (no storage)."""
    return {
        name: torch.empty(shape, dtype=dtype, device="meta")
        for name, (shape, dtype) in layout.items()
    }

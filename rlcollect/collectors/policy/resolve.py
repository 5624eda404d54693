"""Policies resolved once: what the user passed as a TensorDict module (or None for random
actions), its outputs, its grad mode, and a warning when its actions misfit the env's spec.

The per-step callables that run a resolved policy on carrier views are in `policy/steps.py`.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import warnings
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase
from torch import nn

from rlcollect import keys
from rlcollect.envs.base import EnvBase
from rlcollect.envs.torchrl_env import TorchRLEnv

NestedKey = str | tuple[str, ...]
_DICT_ARGUMENT_NAMES = ("tensordict", "td")


def _takes_tensordict(forward: Callable) -> bool:
    parameters = list(inspect.signature(forward).parameters.values())
    if len(parameters) != 1:
        return False
    annotation = parameters[0].annotation
    is_dict_type = isinstance(annotation, type) and issubclass(annotation, TensorDictBase)
    return is_dict_type or parameters[0].name in _DICT_ARGUMENT_NAMES


def _forward_names(module: nn.Module) -> list[str]:
    parameters = inspect.signature(module.forward).parameters.values()
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _match_in_keys(module: nn.Module, observation_keys: Sequence[NestedKey]) -> list[NestedKey]:
    """The observation keys a plain module's forward arguments name: root keys first, as
    TorchRL matches them (a sub-TensorDict such as `"agents"` is handed over whole), then
    nested leaves by their (unique) last name, then the only observation for a one-argument
    forward."""
    names = _forward_names(module)
    tuples = [key if isinstance(key, tuple) else (key,) for key in observation_keys]
    roots = {key[0] for key in tuples}
    if names and all(name in roots for name in names):
        return list(names)
    leaf_names = [key[-1] for key in tuples]
    by_leaf = {key[-1]: key for key in tuples if leaf_names.count(key[-1]) == 1}
    if names and all(name in by_leaf for name in names):
        return [keys.plain_key(by_leaf[name]) for name in names]
    if len(names) == 1 and len(observation_keys) == 1:
        return list(observation_keys)
    unknown = [name for name in names if name not in roots and name not in by_leaf]
    lacking = f" (nothing for {unknown})" if unknown else ""
    raise TypeError(
        "Arguments to policy.forward are incompatible with entries in the env's observations: "
        f"failed to wrap the policy {type(module).__name__}, whose forward takes {names}, "
        f"when the env writes {[keys.plain_key(key) for key in observation_keys]}{lacking}. "
        "Name the forward arguments after the observation keys, or wrap it yourself: "
        "TensorDictModule(policy, in_keys=[...], out_keys=['action'])."
    )


def is_unset_random_policy(policy: Any) -> bool:
    """Whether `policy` is TorchRL's `RandomPolicy()` built without an action spec (duck-typed:
    TorchRL stays optional)."""
    return (
        type(policy).__name__ == "RandomPolicy"
        and type(policy).__module__.startswith("torchrl.")
        and getattr(policy, "action_spec", ...) is None
    )


def torchrl_env_of(env: Any) -> Any:
    """The TorchRL env under `env` (through our wrappers: a step limit, transforms, the
    adapter), `env` itself when it is one, else None. TorchRL is not imported for it."""
    while not isinstance(env, TorchRLEnv) and isinstance(getattr(env, "env", None), EnvBase):
        env = env.env
    if isinstance(env, TorchRLEnv):
        return env.env
    torchrl_envs = sys.modules.get("torchrl.envs")
    if torchrl_envs is not None and isinstance(env, torchrl_envs.EnvBase):
        return env
    return None


def lend_action_spec(policy: Any, env: Any) -> None:
    """Give TorchRL's `RandomPolicy()` built without an action spec the env's, as TorchRL's
    collector does (the user's instance changes: `policy.action_spec` is then set).

    Only a TorchRL env's spec is lent (the policy draws from TorchRL specs); the collector
    draws the random actions itself either way (`resolve_policy` returns None for it).
    """
    if not is_unset_random_policy(policy):
        return
    torchrl_env = torchrl_env_of(env)
    if torchrl_env is not None:
        policy.set_action_spec_from_env(torchrl_env)


def lend_exploration_spec(policy: Any, env: Any) -> None:
    """Give TorchRL's exploration modules built with `spec=None` inside `policy` (e.g.
    `AdditiveGaussianModule`) the env's action spec before the policy is first called, as
    TorchRL's collector does through `set_exploration_modules_spec_from_env`.

    Called before the probe call (which would raise "spec has not been set"). TorchRL is not
    imported: a policy can hold TorchRL's modules only once `torchrl.modules` is imported,
    and only a TorchRL env's spec fits them.
    """
    torchrl_modules = sys.modules.get("torchrl.modules")
    lend = getattr(torchrl_modules, "set_exploration_modules_spec_from_env", None)
    if lend is None or not isinstance(policy, nn.Module):
        return
    torchrl_env = torchrl_env_of(env)
    if torchrl_env is not None:
        lend(policy, torchrl_env)


def warn_if_action_misfits(
    action_spec: Any, action: torch.Tensor, batch_dims: int, action_key: NestedKey = keys.ACTION
) -> None:
    """Warn (once: at construction) when the policy's action does not fit the env's action
    spec in dtype or per-frame shape, naming both: e.g. raw logits (float `[2]`) stored as the
    action of an env that takes a one-hot int64 `[2]` or an index."""
    spec_shape = tuple(action_spec.shape)[batch_dims:]
    action_shape = tuple(action.shape)[batch_dims + 1 :]  # past the time dim
    if action.dtype == action_spec.dtype and action_shape == spec_shape:
        return
    warnings.warn(
        f"the policy writes {action_key!r} as {action.dtype} of shape {list(action_shape)} per "
        "frame, "
        f"but the env's action spec is {action_spec.dtype} of shape {list(spec_shape)} "
        f"({type(action_spec).__name__}); the env may misread it. Make the policy output a "
        "valid action (e.g. sample from its logits with a ProbabilisticTensorDictModule).",
        stacklevel=3,
    )


def resolve_policy(
    policy: Any,
    observation_keys: Sequence[NestedKey],
    action_keys: Sequence[NestedKey] = (keys.ACTION,),
) -> Any:
    """The policy as a `td -> td` callable, or None for random actions.

    A TensorDict module is used as is; a plain `nn.Module` whose forward takes one
    TensorDict is called on TensorDicts; any other `nn.Module` is wrapped in a
    `TensorDictModule` reading the observation keys its forward names and writing the env's
    action key(s) (`"action"`), as TorchRL's collector wraps it.

    Raises:
        TypeError: when the policy is neither of those.
    """
    if policy is None or isinstance(policy, TensorDictModuleBase):
        return policy
    if is_unset_random_policy(policy):
        return None  # TorchRL's collector gives it the env's action spec: random actions
    if isinstance(policy, nn.Module):
        if _takes_tensordict(policy.forward):
            return policy
        in_keys = _match_in_keys(policy, observation_keys)
        return TensorDictModule(policy, in_keys=in_keys, out_keys=list(action_keys))
    if callable(policy) and _takes_tensordict(policy):
        return policy
    raise TypeError(
        f"policy must be None, a TensorDict module, an nn.Module or a callable taking a "
        f"TensorDict; got {type(policy).__name__}. Wrap a plain function with "
        "TensorDictModule(fn, in_keys=['observation'], out_keys=['action'])."
    )


def probe_outputs(
    policy: Any, root: TensorDictBase, action_keys: Sequence[NestedKey] = (keys.ACTION,)
) -> tuple[TensorDictBase, str | None]:
    """Run the policy once on a prototype root: the entries it produced, and what to say
    when it wrote none of the env's action key(s) (None when it wrote them all)."""
    before = set(root.keys(include_nested=True, leaves_only=True))
    with torch.no_grad():
        result = policy(root.clone())
    present = result.keys(include_nested=True, leaves_only=True)
    produced = [key for key in present if key not in before or key in action_keys]
    missing = [key for key in action_keys if key not in present]
    problem = None
    if missing:
        problem = (
            f"the policy must write the env's action key(s) {list(action_keys)} into the "
            f"TensorDict; it produced {produced} and not {missing}. Set out_keys="
            f"{list(action_keys)} (and any other outputs) on the TensorDictModule."
        )
    return result.select(*produced), problem


def policy_outputs(
    policy: Any, root: TensorDictBase, action_keys: Sequence[NestedKey] = (keys.ACTION,)
) -> TensorDictBase:
    """Run the policy once on a prototype root and return the entries it produced.

    Raises:
        ValueError: when it did not write the env's action key(s), naming them.
    """
    outputs, problem = probe_outputs(policy, root, action_keys)
    if problem is not None:
        raise ValueError(problem)
    return outputs


def extra_output_keys(module: TensorDictModule, root: TensorDictBase) -> list[str]:
    """TorchRL's names for what an auto-wrapped module returns past its action(s):
    `"output1"`, `"output2"`, ... for a module that returns a tuple."""
    with torch.no_grad():
        result = module.module(*(root.get(key) for key in module.in_keys))
    if not isinstance(result, tuple):
        return []
    return [f"output{i}" for i in range(1, len(result) - len(module.out_keys) + 1)]


def has_lazy_parameters(policy: Any) -> bool:
    """Whether `policy` still has lazy (uninitialised) parameters."""
    parameters = policy.parameters() if isinstance(policy, nn.Module) else ()
    return any(nn.parameter.is_lazy(parameter) for parameter in parameters)


def _named_tensors(policy: Any) -> list[tuple[str, torch.Tensor]]:
    if not isinstance(policy, nn.Module):
        return []
    return [*policy.named_parameters(), *policy.named_buffers()]


def why_probe_failed(policy: Any, error: Exception) -> str | None:
    """What kept `policy` from running on the env's first observation, when its tensors
    explain `error`: lazy parameters still uninitialised after it (their layers did not fit
    the observation, or were not reached), or meta-device tensors (no data) it tripped on;
    None otherwise.

    A policy may hold meta tensors and run (BenchMARL's models run a meta twin of their
    network with weights held elsewhere): they are named only when the error is about them.
    """
    named = _named_tensors(policy)
    lazy = [name for name, tensor in named if nn.parameter.is_lazy(tensor)]
    if lazy:
        return (
            f"its lazy parameters {lazy} could not be initialised from the env's first "
            f"observation ({error}). Make the lazy layers fit the observation, or give them "
            "their input sizes (e.g. nn.Linear instead of nn.LazyLinear)."
        )
    meta = [name for name, tensor in named if tensor.is_meta]
    if meta and "meta" in str(error):
        return (
            f"its tensors {meta} are on the meta device and hold no data ({error}). Load real "
            "weights into the policy before handing it to the collector, e.g. "
            "policy.to_empty(device='cpu') then policy.load_state_dict(weights)."
        )
    return None


def policy_grad_mode(inference_mode: bool, policy: Any) -> AbstractContextManager[Any]:
    """The context each policy call runs in, inside the loop's `torch.no_grad`.

    `torch.inference_mode` skips autograd's bookkeeping altogether (about 10% off a small
    MLP's call); the outputs are copied into the carrier, so no inference tensor leaves the
    collector. A policy with lazy parameters keeps `no_grad`: parameters materialised under
    inference mode could not be trained. One instance is reused for every step.
    """
    if inference_mode and not has_lazy_parameters(policy):
        return torch.inference_mode()
    return contextlib.nullcontext()

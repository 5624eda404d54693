"""`PolicyHolder`: the collector's policy on its device, its weights and its version, and the
per-step callable that runs it on a carrier (the entry point of the policy room)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase
from torch import nn

from rlcollect import keys
from rlcollect.collectors.policy.acceleration import PolicyAcceleration
from rlcollect.collectors.policy.recurrent_state import policy_state_keys
from rlcollect.collectors.policy.resolve import (
    extra_output_keys,
    policy_grad_mode,
    probe_outputs,
    resolve_policy,
    why_probe_failed,
)
from rlcollect.collectors.policy.steps import (
    DictStep,
    MissingActionStep,
    ModuleStep,
    StackedPolicyStep,
    is_fast_module,
)
from rlcollect.collectors.policy.weights import policy_by_id

NestedKey = str | tuple[str, ...]


def _parameter_devices(module: Any) -> set[torch.device]:
    """The devices of the module's parameters and buffers that hold data: a meta tensor holds
    none (BenchMARL's recurrent models run a weightless meta twin of their network with the
    weights they keep elsewhere), so it needs no moving, as in TorchRL's collector."""
    if not isinstance(module, nn.Module):
        return set()
    tensors = [*module.parameters(), *module.buffers()]
    return {tensor.device for tensor in tensors if not tensor.is_meta}


def _moved_copy(module: nn.Module, device: torch.device) -> nn.Module:
    """A deep copy of `module` with its tensors on `device`; meta tensors stay on the meta
    device (`module.to(device)` would fail on them: they have no data to copy)."""
    copied = copy.deepcopy(module)
    return copied._apply(lambda tensor: tensor if tensor.is_meta else tensor.to(device))


def _holds_tensors(carrier: TensorDictBase, module: Any) -> bool:
    """Whether every in and out key of `module` is a tensor of `carrier` (a module may read a
    whole sub-TensorDict, which only the TensorDict path can hand it)."""
    return all(
        isinstance(carrier.get(key, None), torch.Tensor)
        for key in (*module.in_keys, *module.out_keys)
    )


def _weight_names(weights: Any) -> set[str]:
    """The dotted parameter names of a state dict or a TensorDict of parameters."""
    if isinstance(weights, TensorDictBase):
        return set(weights.flatten_keys(".").keys())
    if isinstance(weights, Mapping):
        return set(weights)
    return set()


def _with_meta_entries(state: Mapping[str, Any], target: nn.Module) -> dict[str, Any]:
    """`state` with `target`'s meta-device entries added where it lacks them, so that a
    strict load accepts weights sent without them (they hold no data to load)."""
    own_meta = {name: t for name, t in target.state_dict().items() if t.is_meta}
    return {**own_meta, **state}


class PolicyHolder:
    """Holds the policy the collector runs, on `device`.

    The user's policy is used as is when its parameters already live on `device`; otherwise a
    deep copy is moved there, and `update()` with no argument copies the user's weights again.
    With `acceleration` (TorchRL's `compile_policy` / `cudagraph_policy`), the per-step calls
    run the compiled callable, built once per module; weights are still loaded into the module.
    """

    def __init__(
        self,
        policy: Any,
        observation_keys: Sequence[Any],
        device: torch.device,
        action_keys: Sequence[Any] = ("action",),
        acceleration: PolicyAcceleration | None = None,
        device_is_explicit: bool = False,
    ) -> None:
        resolved = resolve_policy(policy, observation_keys, action_keys)
        # A plain module we wrapped: its extra outputs are named once its output is seen.
        self._auto_wrapped = resolved is not policy and type(resolved) is TensorDictModule
        self.device = device
        self.version = 0
        self._source = None
        devices = _parameter_devices(resolved)
        if devices and devices != {device}:
            self._source = resolved
            resolved = _moved_copy(resolved, device)
        self.module = resolved
        self.acceleration = acceleration or PolicyAcceleration()
        # What to raise at the first step when the probe call wrote no action (see step_on).
        self.missing_action: str | None = None
        # Whether `device` was asked for (policy_device or device), not a default.
        self.device_is_explicit = device_is_explicit
        self._accelerated: dict[int, tuple[Any, Any]] = {}  # id -> (callable, what it wraps)

    def accelerated(self, policy: Any) -> Any:
        """`policy` compiled / captured as `acceleration` says, built once: every loop
        (another carrier's too) runs the same compiled callable."""
        built = self._accelerated.get(id(policy))
        if built is None or built[1] is not policy:
            built = (self.acceleration.apply(policy, self.device), policy)
            self._accelerated[id(policy)] = built
        return built[0]

    def name_extra_outputs(self, root: TensorDictBase) -> None:
        """Give the outputs of an auto-wrapped module past its action(s) TorchRL's names
        (`"output1"`, ...), from one call on `root`."""
        if not self._auto_wrapped:
            return
        module = self.module
        extra = extra_output_keys(module, root)
        if extra:
            self.module = TensorDictModule(
                module.module, in_keys=module.in_keys, out_keys=[*module.out_keys, *extra]
            )

    def _target_for(self, weights: Any, module: Any) -> nn.Module:
        """The module `weights` belong to: `module`, or the plain module it wraps."""
        is_wrapped_plain = isinstance(module, TensorDictModule) and not isinstance(
            module.module, TensorDictModuleBase
        )
        if not is_wrapped_plain:
            return module
        if isinstance(weights, nn.Module):
            return module if isinstance(weights, TensorDictModuleBase) else module.module
        names = _weight_names(weights)
        if names and names <= set(module.module.state_dict()):
            return module.module
        return module

    def update(
        self, weights: Any = None, version: int | None = None, policy_id: str | None = None
    ) -> None:
        """Load new weights in place; bumps `version` (or sets it, when given).

        Args:
            weights: None (copy again from the policy the collector was given), an
                `nn.Module` of the same structure, a state dict, or a TensorDict of parameters
                as given by `TensorDict.from_module(policy)`.
            version: the version these weights are (a parent collector numbers its updates).
            policy_id: with `policies=`, the one policy these weights are for.
        """
        if self.module is None:
            raise RuntimeError("the collector runs random actions; it has no policy weights.")
        module, source = self.module, self._source
        if policy_id is not None:
            module = policy_by_id(module, policy_id)
            source = None if source is None else source.policy(policy_id)
        if weights is None:
            weights = source
        if weights is not None:
            self._load(weights, module)
        self.version = self.version + 1 if version is None else version

    @torch.no_grad()
    def _load(self, weights: Any, module: Any) -> None:
        """Load `weights` into `module` in place. Meta-device entries hold no data: the
        target keeps its own (weights checked before sending come without them)."""
        target = self._target_for(weights, module)
        if isinstance(weights, TensorDictBase):
            meta = [key for key, tensor in weights.items(True, True) if tensor.is_meta]
            TensorDict.from_module(target).update_(weights.exclude(*meta).to(self.device))
        elif isinstance(weights, nn.Module):
            target.load_state_dict(_with_meta_entries(weights.state_dict(), target))
        elif isinstance(weights, Mapping):
            target.load_state_dict(_with_meta_entries(weights, target))
        else:
            raise TypeError(
                "update_policy_weights_ takes None, an nn.Module, a state dict or a "
                f"TensorDict of parameters; got {type(weights).__name__}."
            )

    @property
    def reads_without_device(self) -> bool:
        """Whether the policy has no device of its own (none asked for, no parameters or
        buffers): it then reads TensorDicts without a device, as in TorchRL."""
        return not self.device_is_explicit and not _parameter_devices(self.module)

    # --- the policy on a carrier ------------------------------------------------------------------

    def learn_outputs(
        self, env: Any, root: TensorDictBase
    ) -> tuple[TensorDictBase | None, list[NestedKey], list[tuple[str, ...]]]:
        """The policy's outputs on `root` (a real first observation of `env`), its output
        keys and the recurrent state keys the collector carries for it (random actions: no
        outputs, the env's action keys).

        A policy that writes no action is accepted here, as TorchRL's collector accepts it
        (an env transform of the user's may need to be added first, see
        `auto_register_policy_transforms`); collecting with it raises (`step_on`)."""
        action_keys = list(env.action_keys)
        if self.module is None:
            return None, action_keys, []
        root = root.exclude(keys.NEXT, *action_keys).to(self.device)
        if self.reads_without_device:
            root.clear_device_()
        self.name_extra_outputs(root)
        try:
            outputs, self.missing_action = probe_outputs(self.module, root, action_keys)
        except Exception as error:
            problem = why_probe_failed(self.module, error)
            if problem is None:
                raise
            raise ValueError(f"the policy cannot run: {problem}") from error
        output_keys = list(outputs.keys(include_nested=True, leaves_only=True))
        # The env's rewards and done flags live under "next" only (TorchRL's step_mdp leaves
        # them there): a policy that writes them (TorchRL's `env.rand_step` as a policy does)
        # is not carrying state.
        step_only = [*env.reward_keys, *env.done_keys]
        return outputs, output_keys, policy_state_keys(output_keys, env.observation_keys, step_only)

    def step_on(
        self,
        carrier: TensorDictBase,
        time_dim: int,
        output_keys: Sequence[NestedKey],
        carrier_device: torch.device,
        inference_mode: bool,
        slots: Sequence[TensorDictBase] | None = None,
    ) -> ModuleStep | DictStep | StackedPolicyStep | MissingActionStep | None:
        """The per-step callable running the policy on `carrier`'s views (None for random
        actions): the tensor fast path when the module reads and writes only tensors of the
        carrier, else the TensorDict path; on the step TensorDicts `slots` of a stacked
        carrier when given; under `torch.inference_mode` when allowed. For a policy that
        writes no action, one that raises a `KeyError` saying so. Every collector's policy
        steps are built here."""
        if self.module is None:
            return None
        if self.missing_action is not None:
            return MissingActionStep(self.missing_action)
        module = self.module
        grad_mode = policy_grad_mode(inference_mode, module)
        if slots is not None:
            policy_device = None if self.device == carrier_device else self.device
            call = self.accelerated(module)
            return StackedPolicyStep(
                call, slots, output_keys, policy_device, carrier_device, grad_mode
            )
        policy_device = self.device if self.device != carrier_device else None
        if carrier.device is None and self.device_is_explicit:
            policy_device = self.device  # a device-less env's TensorDicts get the device asked
        fast = self.acceleration.keeps_tensor_path and is_fast_module(module)
        if fast and _holds_tensors(carrier, module):
            call = self.accelerated(module.module)
            return ModuleStep(module, carrier, time_dim, policy_device, grad_mode, call)
        call = self.accelerated(module)
        deviceless = self.reads_without_device
        return DictStep(call, carrier, time_dim, output_keys, policy_device, grad_mode, deviceless)

    def state_dict(self) -> dict[str, Any]:
        """The policy's state dict (empty for random actions)."""
        return self.module.state_dict() if isinstance(self.module, nn.Module) else {}

    def load_state_dict(self, state: Mapping[str, Any], version: int) -> None:
        """Restore weights and version from a collector checkpoint."""
        if isinstance(self.module, nn.Module) and state:
            self.module.load_state_dict(dict(state))
        self.version = version

"""The per-step callables that run a resolved policy on a bound carrier's views.

* `RandomStep` writes `action_spec.rand()` into the action slot;
* `ModuleStep` is the fast path for a `TensorDictModule` around a plain module: its in/out keys
  are resolved once, and each step calls the module on tensor views and copies its outputs into
  the carrier, with no TensorDict built;
* `DictStep` is the general fallback for any `td -> td` policy;
* `StackedPolicyStep` runs it on the one-TensorDict-a-step carrier of heterogeneous or
  dynamic envs (`stacked_carrier.py`);
* `MissingActionStep` stands for a policy that writes no action: it raises when called.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase

from rlcollect import keys

NestedKey = str | tuple[str, ...]


def _time_views(tensor: torch.Tensor, time_dim: int, count: int) -> list[torch.Tensor]:
    return [tensor.select(time_dim, t) for t in range(count)]


class RandomStep:
    """Writes a random action from the env's action spec(s) into the carrier at step t."""

    def __init__(self, env: Any, carrier: TensorDictBase, time_dim: int) -> None:
        length = carrier.shape[time_dim]
        self._action_keys = list(env.action_keys)
        self._single = self._action_keys == [keys.ACTION]
        # One root action (most envs): draw a tensor; otherwise a TensorDict of them all.
        self._spec = env.action_spec if self._single else env.full_action_spec
        self._slots = [_time_views(carrier.get(key), time_dim, length) for key in self._action_keys]

    def __call__(self, t: int) -> None:
        if self._single:
            self._slots[0][t].copy_(self._spec.rand())
            return
        sample = self._spec.rand()
        for key, slots in zip(self._action_keys, self._slots, strict=True):
            slots[t].copy_(sample.get(key))


class ModuleStep:
    """Fast path: `module(*inputs[t])` with outputs copied into the carrier slots of step t."""

    def __init__(
        self,
        policy: TensorDictModule,
        carrier: TensorDictBase,
        time_dim: int,
        policy_device: torch.device | None,
        grad_mode: AbstractContextManager[Any],
        call: Callable[..., Any] | None = None,
    ) -> None:
        length = carrier.shape[time_dim]
        # `call`: what runs the plain module (e.g. it compiled); the module itself by default.
        self._module = policy.module if call is None else call
        self._grad_mode = grad_mode
        inputs = [_time_views(carrier.get(k), time_dim, length) for k in policy.in_keys]
        outputs = [_time_views(carrier.get(k), time_dim, length) for k in policy.out_keys]
        self._inputs = list(zip(*inputs, strict=True))
        self._outputs = list(zip(*outputs, strict=True))
        self._device = policy_device
        self._single_output = len(policy.out_keys) == 1

    def __call__(self, t: int) -> None:
        inputs = self._inputs[t]
        if self._device is not None:
            inputs = tuple(x.to(self._device, non_blocking=True) for x in inputs)
        with self._grad_mode:
            result = self._module(*inputs)
        if self._single_output:
            self._outputs[t][0].copy_(result if isinstance(result, torch.Tensor) else result[0])
            return
        for slot, value in zip(self._outputs[t], result, strict=True):
            slot.copy_(value)


class DictStep:
    """General path: the policy gets a TensorDict of the root at t; its outputs are copied back."""

    def __init__(
        self,
        policy: Callable[[TensorDictBase], TensorDictBase],
        carrier: TensorDictBase,
        time_dim: int,
        output_keys: Sequence[NestedKey],
        policy_device: torch.device | None,
        grad_mode: AbstractContextManager[Any],
        deviceless: bool = False,
    ) -> None:
        self._policy = policy
        self._grad_mode = grad_mode
        self._deviceless = deviceless
        self._carrier = carrier
        self._time_dim = time_dim
        self._output_keys = list(output_keys)
        self._device = policy_device
        self._views: dict[int, tuple[TensorDictBase, TensorDictBase]] = {}

    def _view(self, t: int) -> tuple[TensorDictBase, TensorDictBase]:
        """The root at `t` (what the policy reads) and the whole frame at `t` (where its
        outputs go, `("next", ...)` ones included, e.g. a recurrent state)."""
        views = self._views.get(t)
        if views is None:
            index = (*([slice(None)] * self._time_dim), t)
            frame = self._carrier[index]
            views = (frame.exclude(keys.NEXT), frame)
            self._views[t] = views
        return views

    def __call__(self, t: int) -> None:
        root, frame = self._view(t)
        request = root.exclude(*self._output_keys).copy()
        if self._device is not None:
            request = request.to(self._device, non_blocking=True)
        elif self._deviceless and request.device is not None:
            request.clear_device_()
        with self._grad_mode:
            result = self._policy(request)
        for key in self._output_keys:
            frame.get(key).copy_(result.get(key))


class MissingActionStep:
    """A policy that writes no action (TorchRL's collector is built with it and fails at its
    first step): each call raises the `KeyError` TorchRL's env step raises, with `problem`."""

    def __init__(self, problem: str) -> None:
        self._problem = problem

    def __call__(self, t: int) -> None:
        raise KeyError(self._problem)


def is_fast_module(policy: Any) -> bool:
    """Whether `policy` is a `TensorDictModule` whose module can be called on tensors."""
    return type(policy) is TensorDictModule and not isinstance(policy.module, TensorDictModuleBase)


class StackedPolicyStep:
    """The policy at step t: handed a copy of the step's root, its outputs set into the step
    (a heterogeneous action is a lazy stack of differently shaped tensors)."""

    def __init__(
        self,
        call: Callable[[TensorDictBase], TensorDictBase],
        slots: Sequence[TensorDictBase],
        output_keys: Sequence[NestedKey],
        policy_device: torch.device | None,
        carrier_device: torch.device,
        grad_mode: AbstractContextManager,
    ) -> None:
        self._call, self._grad_mode = call, grad_mode
        self._slots, self._output_keys = slots, list(output_keys)
        self._to, self._back = policy_device, carrier_device

    def __call__(self, t: int) -> None:
        slot = self._slots[t]
        request = slot.exclude(keys.NEXT, *self._output_keys).copy()
        if self._to is not None:
            request = request.to(self._to, non_blocking=True)
        with self._grad_mode:
            result = self._call(request)
        # Copied outside the policy's grad mode: no inference tensor enters the batch.
        outputs = result.select(*self._output_keys)
        slot.update(outputs.to(self._back) if self._to is not None else outputs.clone())

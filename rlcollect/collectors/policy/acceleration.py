"""TorchRL's `compile_policy` and `cudagraph_policy`: the callable the per-step policy call
runs, compiled with `torch.compile` and/or captured in a CUDA graph, built once.

Only the per-step call is accelerated: the construction-time probe that learns the policy's
outputs runs the module as it is (TorchRL's `compile_with_warmup` also runs the first call
uncompiled), and weights are loaded into the module itself, which the compiled callable wraps.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch


def _options(name: str, value: Any) -> dict[str, Any] | None:
    """`True` or a mapping of keyword arguments as a dict; `None` / `False` as None."""
    if value is None or value is False:
        return None
    if value is True:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(
        f"{name} must be True, False, None or a dict of keyword arguments; got {value!r} "
        f"({type(value).__name__})."
    )


class RequestedAcceleration(NamedTuple):
    """TorchRL's collector attributes for `compile_policy` / `cudagraph_policy`, as asked:
    whether each was asked (`True` or a dict), and its keyword arguments (the dict given, else
    an empty one). Code written for TorchRL's collectors reads them."""

    compiled_policy: bool
    compiled_policy_kwargs: Mapping[str, Any]
    cudagraphed_policy: bool
    cudagraphed_policy_kwargs: Mapping[str, Any]

    @classmethod
    def of(cls, compile_policy: Any, cudagraph_policy: Any) -> RequestedAcceleration:
        """The attributes for these arguments, checked as `PolicyAcceleration` checks them
        (a collector whose workers compile checks them before starting any).

        Raises:
            TypeError: when either is not True, False, None or a dict.
        """
        _options("compile_policy", compile_policy)
        _options("cudagraph_policy", cudagraph_policy)
        return cls(
            compile_policy not in (None, False),
            compile_policy if isinstance(compile_policy, Mapping) else {},
            cudagraph_policy not in (None, False),
            cudagraph_policy if isinstance(cudagraph_policy, Mapping) else {},
        )


@dataclass(frozen=True)
class PolicyAcceleration:
    """What to do to the per-step policy callable (nothing, by default).

    `compile_options` are `torch.compile`'s keyword arguments; TorchRL's `warmup` (calls
    before compiling) is accepted and dropped, the probe call being the uncompiled warm-up.
    `cudagraph_options` are `tensordict.nn.CudaGraphModule`'s; without CUDA the policy runs
    as it is, with a warning, as `CudaGraphModule` itself does on a machine without CUDA.
    """

    compile_options: dict[str, Any] | None = None
    cudagraph_options: dict[str, Any] | None = None

    @classmethod
    def validate(cls, compile_policy: Any, cudagraph_policy: Any) -> PolicyAcceleration:
        compile_options = _options("compile_policy", compile_policy)
        if compile_options is not None:
            compile_options.pop("warmup", None)
        graph_options = _options("cudagraph_policy", cudagraph_policy)
        if graph_options is not None and not torch.cuda.is_available():
            warnings.warn(
                f"cudagraph_policy={cudagraph_policy!r} needs CUDA, which is not available: "
                "the policy runs without a CUDA graph (as TorchRL's CudaGraphModule does on a "
                "machine without CUDA).",
                UserWarning,
                stacklevel=3,
            )
            graph_options = None
        return cls(compile_options, graph_options)

    @property
    def keeps_tensor_path(self) -> bool:
        """Whether the policy may still be called on tensors (a CUDA graph is captured around
        the TensorDict module, as TorchRL captures it)."""
        return self.cudagraph_options is None

    def apply(self, policy: Any, device: torch.device) -> Any:
        """`policy` compiled and/or captured, as configured (itself when neither is)."""
        if self.compile_options is not None:
            policy = torch.compile(policy, **self.compile_options)
        if self.cudagraph_options is not None:
            from tensordict.nn import CudaGraphModule

            policy = CudaGraphModule(policy, device=device, **self.cudagraph_options)
        return policy

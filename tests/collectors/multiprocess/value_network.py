"""CartPole with a value network in a TorchRL env transform (`make_env`), and weights to send."""

from __future__ import annotations

from typing import Any

import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.data import Unbounded
from torchrl.envs import Compose, GymEnv, TransformedEnv
from torchrl.envs.transforms.module import ModuleTransform

VALUE = "env.transform[0].module"


class ValueTransform(ModuleTransform):
    """TorchRL's `ModuleTransform`, applied at reset too, so every step carries `"value"`."""

    def _reset(self, tensordict: Any, tensordict_reset: Any) -> Any:
        return self._call(tensordict_reset)


def value_net(bias: float | None = None) -> TensorDictModule:
    """A linear value network on CartPole's observation; with `bias`, it answers `bias`."""
    torch.manual_seed(0)
    net = TensorDictModule(nn.Linear(4, 1), in_keys=["observation"], out_keys=["value"])
    if bias is not None:
        with torch.no_grad():
            net.module.weight.zero_()
            net.module.bias.fill_(bias)
    return net


def _with_value(spec: Any) -> Any:
    spec["value"] = Unbounded(shape=(*spec.shape, 1))
    return spec


def make_env() -> TransformedEnv:
    """CartPole with a value network in its first transform: its output is in every batch."""
    transform = ValueTransform(
        module=value_net(), no_grad=True, observation_spec_transform=_with_value
    )
    return TransformedEnv(GymEnv("CartPole-v1"), Compose(transform))


def always_right() -> dict[str, torch.Tensor]:
    """Weights of `greedy_module` under which it always picks action 1."""
    return {"module.linear.weight": torch.zeros(2, 4), "module.linear.bias": torch.tensor([0, 1.0])}

"""A TorchRL LSTM (or GRU) policy with fixed weights, for the recurrent-policy tests."""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn

torchrl_modules = pytest.importorskip("torchrl.modules")


def lstm_policy(kind: str = "lstm") -> tuple[TensorDictSequential, object]:
    """A TorchRL LSTM (or GRU) policy and its recurrent module, with fixed weights."""
    torch.manual_seed(0)
    module_class = torchrl_modules.LSTMModule if kind == "lstm" else torchrl_modules.GRUModule
    lstm = module_class(input_size=4, hidden_size=8, in_key="observation", out_key="embed")
    head = TensorDictModule(nn.Linear(8, 2), in_keys=["embed"], out_keys=["logits"])
    to_action = TensorDictModule(
        lambda logits: nn.functional.one_hot(logits.argmax(-1), 2),
        in_keys=["logits"],
        out_keys=["action"],
    )
    return TensorDictSequential(lstm, head, to_action), lstm

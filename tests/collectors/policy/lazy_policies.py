"""Recurrent policies whose modules hold meta or lazy tensors, and the envs to run them on.

`meta_twin_policy` is shaped as BenchMARL 1.5.2 builds its GRU and LSTM models: the weights
live in a `TensorDictParams`, and the network that runs is a twin built on the meta device
(it holds no data), called with those weights swapped in. The env gets BenchMARL's
transforms: an `"is_init"` tracker and a primer for the hidden state, which the policy
writes under `"next"`. `lazy_head_policy` is TorchRL's `GRUModule` / `LSTMModule` with a
`LazyLinear` head, whose parameters exist only once the policy has been called.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from torch import nn

from rlcollect.envs import GymEnv
from rlcollect.transforms import InitTracker, TransformedEnv

torchrl_modules = pytest.importorskip("torchrl.modules")
torchrl_envs = pytest.importorskip("torchrl.envs")
torchrl_data = pytest.importorskip("torchrl.data")

HIDDEN_SIZE = 8
OBSERVATION_SIZE = 4  # CartPole-v1
STATE_KEYS = {"gru": ["_hidden_gru_0"], "lstm": ["_hidden_lstm_h_0", "_hidden_lstm_c_0"]}


class MetaTwinRecurrent(TensorDictModuleBase):
    """One recurrent cell run as BenchMARL runs its GRU / LSTM: weights in `self.params`,
    swapped into a weightless meta-device twin of the cell at each call; the state is zeroed
    where `"is_init"` is set, and the new state written under `"next"`."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        cell_class = torchrl_modules.GRUCell if kind == "gru" else torchrl_modules.LSTMCell
        self.kind = kind
        self.state_keys = STATE_KEYS[kind]
        self.in_keys = ["observation", "is_init", *self.state_keys]
        self.out_keys = ["embed", *(("next", key) for key in self.state_keys)]
        cell = cell_class(OBSERVATION_SIZE, HIDDEN_SIZE)
        self.params = TensorDict.from_module(cell, as_module=True)
        with torch.device("meta"):
            self._empty_cell = cell_class(OBSERVATION_SIZE, HIDDEN_SIZE)
            TensorDict.from_module(self._empty_cell).data.to("meta").to_module(self._empty_cell)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        is_init = tensordict.get("is_init")
        states = [torch.where(is_init, 0, tensordict.get(key)) for key in self.state_keys]
        observation = tensordict.get("observation")
        with self.params.to_module(self._empty_cell):
            if self.kind == "gru":
                new_states = [self._empty_cell(observation, states[0])]
            else:
                new_states = list(self._empty_cell(observation, tuple(states)))
        tensordict.set("embed", new_states[0])
        for key, state in zip(self.state_keys, new_states, strict=True):
            tensordict.set(("next", key), state)
        return tensordict


def greedy_one_hot(logits: torch.Tensor) -> torch.Tensor:
    """CartPole's one-hot action from the logits (a module-level function: it pickles)."""
    return nn.functional.one_hot(logits.argmax(-1), logits.shape[-1])


def _with_head(recurrent: nn.Module, head: nn.Module) -> TensorDictSequential:
    return TensorDictSequential(
        recurrent,
        TensorDictModule(head, in_keys=["embed"], out_keys=["logits"]),
        TensorDictModule(greedy_one_hot, in_keys=["logits"], out_keys=["action"]),
    )


def meta_twin_policy(kind: str, seed: int = 0) -> TensorDictSequential:
    """A BenchMARL-shaped GRU or LSTM policy (see `MetaTwinRecurrent`), same weights per seed."""
    torch.manual_seed(seed)
    return _with_head(MetaTwinRecurrent(kind), nn.Linear(HIDDEN_SIZE, 2))


def meta_twin_env() -> object:
    """CartPole with BenchMARL's recurrent transforms (TorchRL's): `"is_init"` and a primer
    for both models' states; run by both collectors (BenchMARL hands TorchRL envs over)."""
    spec = torchrl_data.Composite(
        {
            key: torchrl_data.Unbounded(shape=(HIDDEN_SIZE,))
            for keys in STATE_KEYS.values()
            for key in keys
        }
    )
    return torchrl_envs.TransformedEnv(
        torchrl_envs.GymEnv("CartPole-v1"),
        torchrl_envs.Compose(
            torchrl_envs.InitTracker(init_key="is_init"),
            torchrl_envs.TensorDictPrimer(spec, reset_key="_reset", expand_specs=True),
        ),
    )


def lazy_head_policy(kind: str, seed: int = 0) -> TensorDictSequential:
    """TorchRL's GRUModule / LSTMModule under a `LazyLinear` head (uninitialised until called)."""
    torch.manual_seed(seed)
    module_class = torchrl_modules.GRUModule if kind == "gru" else torchrl_modules.LSTMModule
    recurrent = module_class(
        input_size=OBSERVATION_SIZE, hidden_size=HIDDEN_SIZE, in_key="observation", out_key="embed"
    )
    return _with_head(recurrent, nn.LazyLinear(2))


def lazy_head_env_ours() -> TransformedEnv:
    """CartPole for our collector: it carries the recurrent state itself (no primer)."""
    return TransformedEnv(GymEnv("CartPole-v1"), InitTracker())


def lazy_head_env_torchrl(kind: str) -> object:
    """CartPole for TorchRL's collector, with TorchRL's recipe: InitTracker and the
    recurrent module's primer."""
    primer = lazy_head_policy(kind)[0].make_tensordict_primer()
    return torchrl_envs.TransformedEnv(
        torchrl_envs.GymEnv("CartPole-v1"),
        torchrl_envs.Compose(torchrl_envs.InitTracker(), primer),
    )


def initialised(policy: nn.Module) -> nn.Module:
    """`policy` after one call on a CartPole-shaped input, which materialises lazy parameters."""
    example = TensorDict(
        observation=torch.zeros(OBSERVATION_SIZE), is_init=torch.ones(1, dtype=torch.bool)
    )
    for key in (key for keys in STATE_KEYS.values() for key in keys):
        example.set(key, torch.zeros(HIDDEN_SIZE))
    with torch.no_grad():
        policy(example)
    return policy


def real_weights(policy: nn.Module) -> dict[str, torch.Tensor]:
    """The policy's state dict without its meta-device entries (which hold no data)."""
    return {name: value for name, value in policy.state_dict().items() if not value.is_meta}

"""`EnvProtocol`: the TorchRL env contract, what a foreign (TorchRL) env must provide.

rlcollect's `EnvBase` and TorchRL's `EnvBase` both satisfy it, so the code that only drives an
env through TensorDicts (`run_rollout`, and the checks that accept a foreign env) is typed
against this protocol instead of importing a base class. The contract is DESIGN.md's "Envs":

* `batch_size`, `device`, and the specs `observation_spec`, `action_spec`, `reward_spec`,
  `done_spec` (rlcollect's or TorchRL's spec classes);
* `observation_keys` and `done_keys`, the leaf keys of the observation and done specs;
* `reset(td=None)`: the root of a fresh step; with `td["_reset"]` (a bool mask over the batch)
  only those sub-envs reset;
* `step(td)`: writes the `"next"` sub-TensorDict and returns `td`;
* `step_and_maybe_reset(td) -> (td, next_root)`: steps, resets the finished sub-envs and
  returns the root for the next step;
* `rand_action(td)`, `set_seed(seed)` (sub-env i gets `seed + i`) and `close()`.

The buffer face (`bind`, `reset_into`, `step_and_advance_into`) is rlcollect's own and is not
part of this contract: a foreign env gets it from `TorchRLEnv`, which derives it from these
methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from tensordict import NestedKey, TensorDictBase


@runtime_checkable
class EnvProtocol(Protocol):
    """An env driven through TensorDicts, as TorchRL's and rlcollect's envs are.

    `isinstance(env, EnvProtocol)` checks only that the members exist (Python's runtime check
    of a protocol); the module docstring states what each must do.

    Examples:
        >>> from rlcollect.envs import GymEnv
        >>> env = GymEnv("CartPole-v1")
        >>> isinstance(env, EnvProtocol)
        True
        >>> isinstance(object(), EnvProtocol)
        False
        >>> env.close()
    """

    @property
    def batch_size(self) -> torch.Size:
        """The env batch dims (`torch.Size([])` for a single env)."""

    @property
    def device(self) -> torch.device | None:
        """Where the env's tensors live (None: a TorchRL env without a device)."""

    @property
    def observation_spec(self) -> Any:
        """The observation keys' specs, as one composite spec."""

    @property
    def action_spec(self) -> Any:
        """The action's spec."""

    @property
    def reward_spec(self) -> Any:
        """The reward's spec."""

    @property
    def done_spec(self) -> Any:
        """The flags' specs (`done`, `terminated`, `truncated`), as one composite spec."""

    @property
    def observation_keys(self) -> Sequence[NestedKey]:
        """Every observation leaf key."""

    @property
    def done_keys(self) -> Sequence[NestedKey]:
        """Every flag key."""

    def reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        """The root of a fresh step (only the sub-envs of `tensordict["_reset"]`, if given)."""

    def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Step with `tensordict["action"]`; writes `"next"` and returns `tensordict`."""

    def step_and_maybe_reset(
        self, tensordict: TensorDictBase
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """Step, reset the sub-envs that are done; returns `(tensordict, next root)`."""

    def rand_action(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """Write a random action into `tensordict` (a new one if None) and return it."""

    def set_seed(self, seed: int) -> Any:
        """Seed the env (sub-env i gets `seed + i`); returns the next seed to use."""

    def close(self) -> None:
        """Release the env's resources."""

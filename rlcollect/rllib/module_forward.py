"""The RLModule as the engine's policy step: called on the carrier's batched observation tensor,
with what RLlib's default connector pieces would do around it, done once on the whole batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import tree
from ray.rllib.connectors.common import (
    AddObservationsFromEpisodesToBatch,
    AddStatesFromEpisodesToBatch,
    AddTimeDimToBatchAndZeroPad,
    BatchIndividualItems,
    NumpyToTensor,
    TensorToNumpy,
)
from ray.rllib.connectors.module_to_env import (
    GetActions,
    ListifyDataForVectorEnv,
    NormalizeAndClipActions,
    RemoveSingleTsTimeRankFromBatch,
    UnBatchToIndividualItems,
)
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.rllib.utils.spaces.space_utils import clip_action, unsquash_action
from torch import nn

# The carrier's keys: the env reads "action"; RLlib's columns (its actions, before unsquashing or
# clipping, and the module's extra outputs) live under "rllib".
ACTION_KEY = "action"
RLLIB_KEY = "rllib"
ACTIONS = Columns.ACTIONS

# RLlib's default pieces, in the order its config puts them into the two pipelines (single agent).
DEFAULT_ENV_TO_MODULE = (
    AddObservationsFromEpisodesToBatch,
    AddTimeDimToBatchAndZeroPad,
    AddStatesFromEpisodesToBatch,
    BatchIndividualItems,
    NumpyToTensor,
)
DEFAULT_MODULE_TO_ENV = (
    GetActions,
    TensorToNumpy,
    UnBatchToIndividualItems,
    RemoveSingleTsTimeRankFromBatch,
    NormalizeAndClipActions,
    ListifyDataForVectorEnv,
)


def has_only_default_pieces(pipeline: Any, defaults: tuple[type, ...]) -> bool:
    """Whether `pipeline` is exactly RLlib's default pieces (no user connector, no subclass)."""
    return tuple(type(piece) for piece in pipeline.connectors) == defaults


def _leaf_to_numpy(leaf: Any) -> Any:
    """A tensor as RLlib's `TensorToNumpy` gives it: floats as float32, integers as int32."""
    if not isinstance(leaf, torch.Tensor):
        return leaf
    array = leaf.numpy(force=True)
    if np.issubdtype(array.dtype, np.floating):
        return array.astype(np.float32, copy=False)
    if np.issubdtype(array.dtype, np.integer):
        return array.astype(np.int32, copy=False)
    return array


def _to_numpy(output: dict[str, Any]) -> dict[str, Any]:
    """The module's outputs as NumPy (a flat dict of tensors, the usual case, without walking
    it with `tree`, which costs more than the conversion on small batches)."""
    return {
        key: _leaf_to_numpy(value)
        if isinstance(value, (torch.Tensor, np.ndarray))
        else tree.map_structure(_leaf_to_numpy, value)
        for key, value in output.items()
    }


def sample_categorical(output: dict[str, Any]) -> None:
    """Sample RLlib's `TorchCategorical` from its logits, with the log-probability of the
    sample, in NumPy: the CDF inverted with one uniform draw per row (NumPy's global generator,
    which RLlib seeds with `config.seed`). `Categorical.sample` calls `torch.multinomial`, and
    each small torch op costs several times a NumPy one on a batch of a few rows."""
    logits = _leaf_to_numpy(output[Columns.ACTION_DIST_INPUTS])
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    cumulative = np.exp(log_probs).cumsum(axis=-1)
    uniform = np.random.random((*cumulative.shape[:-1], 1))
    actions = (cumulative < uniform).sum(axis=-1).clip(max=cumulative.shape[-1] - 1)
    output[Columns.ACTION_DIST_INPUTS] = logits
    output[Columns.ACTIONS] = actions.astype(np.int32)
    if Columns.ACTION_LOGP not in output:
        chosen = np.take_along_axis(log_probs, actions[..., None], axis=-1)[..., 0]
        output[Columns.ACTION_LOGP] = chosen.astype(np.float32)


class RLModuleForward:
    """One forward of the RLModule for a batch of sub-envs, without episodes or connectors.

    What RLlib's default pipelines do per sub-env and per step (read each observation back from
    its episode, batch, make a tensor; after the forward, sample from the action distribution,
    make NumPy arrays, unbatch, unsquash or clip) is done here once on the batch: the vector
    env's observation array becomes the module's input tensor without a copy.

    Args:
        module: the runner's (single-agent) RLModule.
        action_space: one sub-env's action space (for unsquashing / clipping).
        normalize_actions: `config.normalize_actions`.
        clip_actions: `config.clip_actions`.
        device: where the module runs.
    """

    def __init__(
        self,
        module: Any,
        action_space: gym.Space,
        *,
        normalize_actions: bool,
        clip_actions: bool,
        device: torch.device | str,
    ) -> None:
        self._module = module
        self._action_space = action_space
        self._normalize = normalize_actions
        self._clip = clip_actions
        self._device = torch.device(device)
        self._distribution_classes: dict[bool, Any] = {}
        # RLlib's torch wrappers switch the module to eval mode and back around every forward
        # (two walks over its submodules); a runner's inference-only module is never trained,
        # so it stays in eval mode and the wrapped forward is called directly.
        self._direct = isinstance(module, TorchRLModule) and (
            type(module).forward_exploration is TorchRLModule.forward_exploration
            and type(module).forward_inference is TorchRLModule.forward_inference
        )

    def __call__(
        self, observations: torch.Tensor, *, explore: bool, t: int
    ) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """Actions for the batch: `(actions, actions_for_env, extra_model_outputs)`, batched.

        `actions` are what the distribution gave (kept in the episodes), `actions_for_env` the
        unsquashed or clipped copy sent to the env, the extras every other module output.
        """
        batch = {Columns.OBS: observations.to(self._device)}
        output = self._forward(batch, explore, t)
        if Columns.ACTIONS not in output:
            self._sample_actions(output, explore)
        output = _to_numpy(output)
        actions = output.pop(Columns.ACTIONS)
        output.pop(Columns.ACTIONS_FOR_ENV, None)
        return actions, self._actions_for_env(actions), output

    def _forward(self, batch: dict[str, Any], explore: bool, t: int) -> dict[str, Any]:
        module = self._module
        if not self._direct:
            if explore:
                return module.forward_exploration(batch, t=t)
            return module.forward_inference(batch)
        if module.training:
            module.eval()
        if explore:
            return module._forward_exploration(batch, t=t)
        return module._forward_inference(batch)

    def _sample_actions(self, output: dict[str, Any], explore: bool) -> None:
        """RLlib's `GetActions`: sample from the distribution the module's outputs define."""
        distribution_class = self._distribution_class(explore)
        if explore and distribution_class is TorchCategorical:
            sample_categorical(output)
            return
        distribution = distribution_class.from_logits(output[Columns.ACTION_DIST_INPUTS])
        if not explore:
            distribution = distribution.to_deterministic()
        actions = distribution.sample()
        output[Columns.ACTIONS] = actions
        if Columns.ACTION_LOGP not in output:
            output[Columns.ACTION_LOGP] = distribution.logp(actions)

    def _distribution_class(self, explore: bool) -> Any:
        """The module's action distribution class for `explore` (asked once: it is fixed)."""
        if explore not in self._distribution_classes:
            module = self._module
            self._distribution_classes[explore] = (
                module.get_exploration_action_dist_cls()
                if explore
                else module.get_inference_action_dist_cls()
            )
        return self._distribution_classes[explore]

    def _actions_for_env(self, actions: np.ndarray) -> np.ndarray:
        """RLlib's `NormalizeAndClipActions` on the whole batch (the space's bounds broadcast)."""
        if self._normalize:
            return unsquash_action(actions, self._action_space)
        if self._clip:
            return clip_action(actions, self._action_space)
        return actions


class RLModulePolicy(nn.Module):
    """The engine's policy step around an `RLModuleForward`: the carrier's observation tensor
    in; the env's action, RLlib's action and the module's extra outputs out, as tensors the
    engine copies into their carrier slots (`TensorDictModule(..., out_keys=self.out_keys)`).

    The extra outputs' names and dtypes are learnt from one inference forward on `probe` (no
    random draw); `explore` and the exploration timestep are set per sample by the door.

    Args:
        forward: the RLModule's batched forward.
        probe: a batch of observations the module accepts.

    Raises:
        TypeError: an output that is not one array per sub-env (e.g. a nested dict).
    """

    def __init__(self, forward: RLModuleForward, probe: torch.Tensor) -> None:
        super().__init__()
        # Kept out of the module tree: the engine never copies or moves the RLModule, whose
        # weights the runner sets in place.
        self.__dict__["_rl_forward"] = forward
        self.explore = True
        self._timestep: Callable[[int], int] = lambda steps: 0
        self._steps_per_call = probe.shape[0]
        self._calls = 0
        actions, _, extras = forward(probe, explore=False, t=0)
        for name, value in extras.items():
            if not isinstance(value, np.ndarray) or value.shape[:1] != actions.shape[:1]:
                raise TypeError(
                    f"the RLModule's output {name!r} is not one array per sub-env "
                    f"({type(value).__name__}); the engine's step keeps arrays only."
                )
        self.extra_names = sorted(extras)
        # RLlib's dtype of each column, per explore mode (seen at the mode's first forward).
        self._dtypes: dict[bool, dict[str, np.dtype]] = {}
        self._integer_extras: dict[bool, list[int]] = {}

    @property
    def out_keys(self) -> list[Any]:
        """Where the outputs go in the carrier: the env's action, then RLlib's columns."""
        return [ACTION_KEY, *[(RLLIB_KEY, name) for name in (ACTIONS, *self.extra_names)]]

    def begin(self, explore: bool, timestep: Callable[[int], int]) -> None:
        """Start a sample: `explore` or inference, and the exploration timestep of the
        sample's `n`-th env step (`timestep(n)`)."""
        self.explore, self._timestep, self._calls = explore, timestep, 0

    @property
    def dtypes(self) -> dict[str, np.dtype]:
        """RLlib's dtype of its actions and of each extra output, in the current explore mode."""
        return self._dtypes[self.explore]

    def _learn_dtypes(self, outputs: list[np.ndarray]) -> None:
        """The current mode's column dtypes, and which extra outputs are integers, from its
        first forward's `outputs` (the env's action, RLlib's action, the extras)."""
        names = (ACTIONS, *self.extra_names)
        self._dtypes[self.explore] = {
            name: value.dtype for name, value in zip(names, outputs[1:], strict=True)
        }
        self._integer_extras[self.explore] = [
            index for index in range(2, len(outputs)) if outputs[index].dtype.kind in "biu"
        ]

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = self._timestep(self._calls * self._steps_per_call)
        self._calls += 1
        actions, actions_for_env, extras = self._rl_forward(observation, explore=self.explore, t=t)
        outputs = [actions_for_env, actions, *[extras[name] for name in self.extra_names]]
        if self.explore not in self._dtypes:
            self._learn_dtypes(outputs)
        # An extra output's carrier slot is made by the first forward, of either mode; a
        # column that is integer in one mode (the log-probability of a deterministic action)
        # and float in the other must fit one slot: integers travel as float64, exactly.
        for index in self._integer_extras[self.explore]:
            outputs[index] = outputs[index].astype(np.float64)
        return tuple(torch.from_numpy(np.ascontiguousarray(value)) for value in outputs)

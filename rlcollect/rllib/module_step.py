"""The fast path's policy step: the RLModule called on the batched observation tensor, with what
RLlib's default connector pieces would do around it, done once on the whole batch."""

from __future__ import annotations

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


class ModuleStep:
    """One policy step for a batch of sub-envs, without episodes or connectors.

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
        self, observations: np.ndarray, *, explore: bool, t: int
    ) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """Actions for the batch: `(actions, actions_for_env, extra_model_outputs)`, batched.

        `actions` are what the distribution gave (kept in the episodes), `actions_for_env` the
        unsquashed or clipped copy sent to the env, the extras every other module output.
        """
        batch = {Columns.OBS: torch.from_numpy(observations).to(self._device)}
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

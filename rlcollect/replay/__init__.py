"""Replay buffers and on-policy rollout storage, with TorchRL's names and semantics."""

from __future__ import annotations

from rlcollect.batch.rollout_layout import as_torchrl, torchrl_transitions
from rlcollect.replay.memmap_storage import LazyMemmapStorage
from rlcollect.replay.prioritized_sampler import PrioritizedSampler
from rlcollect.replay.ray_buffer import RayReplayBuffer, RayReplayBufferClient
from rlcollect.replay.replay_buffer import ReplayBuffer
from rlcollect.replay.rollout_buffer import RolloutBuffer, iterate_minibatches, transition_view
from rlcollect.replay.samplers import RandomSampler, Sampler, SamplerWithoutReplacement
from rlcollect.replay.slice_sampler import SliceSampler
from rlcollect.replay.storage import ListStorage, Storage
from rlcollect.replay.tensor_storage import LazyTensorStorage, TensorStorage
from rlcollect.replay.writers import RoundRobinWriter, Writer

__all__ = [
    "LazyMemmapStorage",
    "LazyTensorStorage",
    "ListStorage",
    "PrioritizedSampler",
    "RandomSampler",
    "RayReplayBuffer",
    "RayReplayBufferClient",
    "ReplayBuffer",
    "RolloutBuffer",
    "RoundRobinWriter",
    "Sampler",
    "SamplerWithoutReplacement",
    "SliceSampler",
    "Storage",
    "TensorStorage",
    "Writer",
    "as_torchrl",
    "iterate_minibatches",
    "torchrl_transitions",
    "transition_view",
]

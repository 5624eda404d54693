"""rlcollect: fast, composable data collection for reinforcement learning in PyTorch."""

from rlcollect.collectors import (
    Collector,
    MultiAsyncCollector,
    MultiSyncCollector,
    ViewRequirement,
)
from rlcollect.compact import compact_batch, transition_view
from rlcollect.envs import (
    EnvBase,
    GymEnv,
    GymVectorEnv,
    ParallelEnv,
    SerialEnv,
)
from rlcollect.replay import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    RolloutBuffer,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    SliceSampler,
)
from rlcollect.transforms import (
    GAE,
    CatFrames,
    Compose,
    DoubleToFloat,
    InitTracker,
    MultiStep,
    ObservationNorm,
    RewardSum,
    StepCounter,
    TransformedEnv,
    split_trajectories,
)

__all__ = [
    "GAE",
    "CatFrames",
    "Collector",
    "Compose",
    "DoubleToFloat",
    "EnvBase",
    "GymEnv",
    "GymVectorEnv",
    "InitTracker",
    "LazyMemmapStorage",
    "LazyTensorStorage",
    "ListStorage",
    "MultiAsyncCollector",
    "MultiStep",
    "MultiSyncCollector",
    "ObservationNorm",
    "ParallelEnv",
    "PrioritizedSampler",
    "RandomSampler",
    "ReplayBuffer",
    "RewardSum",
    "RolloutBuffer",
    "RoundRobinWriter",
    "SamplerWithoutReplacement",
    "SerialEnv",
    "SliceSampler",
    "StepCounter",
    "TransformedEnv",
    "ViewRequirement",
    "compact_batch",
    "split_trajectories",
    "transition_view",
]
__version__ = "0.1.0"

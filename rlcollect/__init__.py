"""rlcollect: fast, composable data collection for reinforcement learning in PyTorch.

Ray is imported only when a Ray class is built: `import rlcollect` works without the ray extra.
"""

from rlcollect.batch.compact import compact_batch, transition_view
from rlcollect.batch.episodes import Episode, EpisodeJoiner
from rlcollect.batch.multi_agent_episode import AgentEpisodes
from rlcollect.collectors import (
    AsyncBatchedCollector,
    AsyncCollector,
    Collector,
    DataCollectorBase,
    Evaluator,
    MultiAsyncCollector,
    MultiaSyncDataCollector,
    MultiCollector,
    MultiSyncCollector,
    MultiSyncDataCollector,
    PolicyMap,
    RayCollector,
    SyncDataCollector,
    ViewRequirement,
    aSyncDataCollector,
)
from rlcollect.envs import (
    EnvBase,
    GymEnv,
    GymVectorEnv,
    ParallelEnv,
    SerialEnv,
)
from rlcollect.patch import patch_torchrl, unpatch_torchrl
from rlcollect.replay import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedSampler,
    RandomSampler,
    RayReplayBuffer,
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
    "AgentEpisodes",
    "AsyncBatchedCollector",
    "AsyncCollector",
    "CatFrames",
    "Collector",
    "Compose",
    "DataCollectorBase",
    "DoubleToFloat",
    "EnvBase",
    "Episode",
    "EpisodeJoiner",
    "Evaluator",
    "GymEnv",
    "GymVectorEnv",
    "InitTracker",
    "LazyMemmapStorage",
    "LazyTensorStorage",
    "ListStorage",
    "MultiAgentEpisode",
    "MultiAsyncCollector",
    "MultiCollector",
    "MultiStep",
    "MultiSyncCollector",
    "MultiSyncDataCollector",
    "MultiaSyncDataCollector",
    "ObservationNorm",
    "ParallelEnv",
    "PolicyMap",
    "PrioritizedSampler",
    "RandomSampler",
    "RayCollector",
    "RayReplayBuffer",
    "ReplayBuffer",
    "RewardSum",
    "RolloutBuffer",
    "RoundRobinWriter",
    "SamplerWithoutReplacement",
    "SerialEnv",
    "SliceSampler",
    "StepCounter",
    "SyncDataCollector",
    "TransformedEnv",
    "ViewRequirement",
    "aSyncDataCollector",
    "compact_batch",
    "patch_torchrl",
    "split_trajectories",
    "transition_view",
    "unpatch_torchrl",
]
__version__ = "0.1.0"


# The earlier name of `AgentEpisodes` (RLlib's multi-agent episode class has the same name).
MultiAgentEpisode = AgentEpisodes

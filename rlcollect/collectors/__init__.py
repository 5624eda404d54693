"""Collectors: step envs with a policy and hand batches to training.

`Collector` is also TorchRL's front door: `Collector(..., num_collectors=N)` (or `backend=
"process" | "ray"`) returns a multi-process or Ray collector; both rooms register their
backend when imported here.

The Ray classes import Ray only when built, so this package imports without the ray extra.
"""

from rlcollect.collectors.batched.collector import AsyncBatchedCollector
from rlcollect.collectors.evaluation.evaluator import Evaluator
from rlcollect.collectors.legacy_names import (
    DataCollectorBase,
    MultiaSyncDataCollector,
    MultiSyncDataCollector,
    SyncDataCollector,
    aSyncDataCollector,
)
from rlcollect.collectors.multiprocess.async_collector import MultiAsyncCollector
from rlcollect.collectors.multiprocess.front_door import AsyncCollector, MultiCollector
from rlcollect.collectors.multiprocess.sync_collector import MultiSyncCollector
from rlcollect.collectors.policy.policy_map import PolicyMap
from rlcollect.collectors.ray.collector import RayCollector
from rlcollect.collectors.ray.fleet import ActorError, ActorTimeoutError
from rlcollect.collectors.sampling.view_requirements import ViewRequirement
from rlcollect.collectors.single.collector import Collector
from rlcollect.collectors.weights.ray_scheme import RayWeightSyncScheme
from rlcollect.collectors.weights.schemes import (
    MultiProcessWeightSyncScheme,
    NoWeightSyncScheme,
    SharedMemWeightSyncScheme,
    WeightSyncScheme,
)

__all__ = [
    "ActorError",
    "ActorTimeoutError",
    "AsyncBatchedCollector",
    "AsyncCollector",
    "Collector",
    "DataCollectorBase",
    "Evaluator",
    "MultiAsyncCollector",
    "MultiCollector",
    "MultiProcessWeightSyncScheme",
    "MultiSyncCollector",
    "MultiSyncDataCollector",
    "MultiaSyncDataCollector",
    "NoWeightSyncScheme",
    "PolicyMap",
    "RayCollector",
    "RayWeightSyncScheme",
    "SharedMemWeightSyncScheme",
    "SyncDataCollector",
    "ViewRequirement",
    "WeightSyncScheme",
    "aSyncDataCollector",
]

"""Collectors: step envs with a policy and hand batches to training."""

from rlcollect.collectors.collector import Collector
from rlcollect.collectors.multi_async import MultiAsyncCollector
from rlcollect.collectors.multi_sync import MultiSyncCollector
from rlcollect.collectors.view_requirements import ViewRequirement
from rlcollect.collectors.weight_sync import (
    MultiProcessWeightSyncScheme,
    NoWeightSyncScheme,
    SharedMemWeightSyncScheme,
    WeightSyncScheme,
)

__all__ = [
    "Collector",
    "MultiAsyncCollector",
    "MultiProcessWeightSyncScheme",
    "MultiSyncCollector",
    "NoWeightSyncScheme",
    "SharedMemWeightSyncScheme",
    "ViewRequirement",
    "WeightSyncScheme",
]

"""What the patch rebinds: TorchRL's collector names, the modules that hold them, ours for each.

Only the modules TorchRL's users, its trainers and Hydra `_target_` strings import the classes
from are rebound (`torchrl.collectors`, and `torchrl.collectors.collectors`, its re-export kept
for old code). The modules that define TorchRL's classes keep them: TorchRL's remaining
collectors (the LLM collector subclasses `Collector`; the distributed collectors check
`issubclass(..., Collector)` and build one on the main node) run on TorchRL's classes, as
without the patch.
"""

from __future__ import annotations

import importlib.metadata
import sys
from typing import Any

# The TorchRL releases the patch was run against (its tests: tests/torchrl_frontends/test_patch.py).
TESTED_TORCHRL_VERSIONS = ("0.14.1",)
# Where TorchRL's code and Hydra `_target_`s find the classes (0.14.1).
PATCHED_MODULES = ("torchrl.collectors", "torchrl.collectors.collectors")
# TorchRL's names with an equivalent here.
CURRENT_NAMES = (
    "Collector",
    "MultiCollector",
    "MultiSyncCollector",
    "MultiAsyncCollector",
    "AsyncCollector",
    "AsyncBatchedCollector",
    "Evaluator",
)
# TorchRL's names until 0.11, removed in 0.14; `DataCollectorBase` is TorchRL's own base again.
LEGACY_NAMES = (
    "SyncDataCollector",
    "MultiSyncDataCollector",
    "MultiaSyncDataCollector",
    "aSyncDataCollector",
    "DataCollectorBase",
)
# Kept as TorchRL's (named in the message the patch prints).
KEPT_AS_TORCHRL = (
    "BaseCollector (our collectors pass isinstance checks against it)",
    "torchrl.collectors.distributed.*",
    "torchrl.collectors.llm.*",
)


def ours() -> dict[str, Any]:
    """Our class for each TorchRL name, current and legacy (imported here: the patch runs
    after TorchRL, and so torch, is imported)."""
    from rlcollect import collectors

    current = {name: getattr(collectors, name) for name in CURRENT_NAMES}
    legacy = {name: getattr(collectors, name) for name in LEGACY_NAMES[:-1]}
    # Old TorchRL code subclasses `DataCollectorBase` or checks isinstance against it: TorchRL's
    # base does both, for TorchRL's collectors and (a registered virtual subclass) ours.
    legacy["DataCollectorBase"] = sys.modules["torchrl.collectors"].BaseCollector
    return current | legacy


def torchrl_version() -> str:
    """The TorchRL release imported here, as `torchrl.__version__` says (else its metadata)."""
    version = getattr(sys.modules.get("torchrl"), "__version__", None)
    if version:
        return str(version)
    try:
        return importlib.metadata.version("torchrl")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"

"""`patch_torchrl()` and `unpatch_torchrl()`: TorchRL's collector names bound to ours in this
process and in every process it starts afterwards, and TorchRL's objects put back."""

from __future__ import annotations

import logging
import os
import threading
import warnings
from dataclasses import dataclass, field

from rlcollect.patch import child_environment, construction_log, rebinding, targets

logger = logging.getLogger("rlcollect.patch")


class UntestedTorchRLVersionWarning(UserWarning):
    """The TorchRL imported is not a release the patch was tested against."""


@dataclass
class _Patch:
    rebindings: list[rebinding.Rebinding]
    variables_before: dict[str, str | None]
    construction_log: construction_log.ConstructionLog | None
    missing: list[str] = field(default_factory=list)


_applied: _Patch | None = None
_lock = threading.RLock()


def is_patched() -> bool:
    """Whether TorchRL's collector names are bound to ours in this process now."""
    return _applied is not None


def _check_version(version: str, missing: list[str]) -> None:
    if version in targets.TESTED_TORCHRL_VERSIONS and not missing:
        return
    tested = ", ".join(targets.TESTED_TORCHRL_VERSIONS)
    lacking = f" It lacks {', '.join(missing)}: those stay unpatched." if missing else ""
    warnings.warn(
        f"rlcollect.patch_torchrl() was tested with TorchRL {tested}; this is TorchRL "
        f"{version}.{lacking} Check your run's collectors (RLCOLLECT_PATCH_VERBOSE=1 lists "
        f"each one built), or install torchrl=={targets.TESTED_TORCHRL_VERSIONS[-1]}.",
        UntestedTorchRLVersionWarning,
        stacklevel=3,
    )


def _announce(version: str, patch: _Patch) -> None:
    """Say once per run (not in each worker) what the patch did."""
    if os.environ.get(child_environment.ANNOUNCED_VARIABLE):
        return
    current = [r.name for r in patch.rebindings if r.module.__name__ == "torchrl.collectors"]
    rebound = [name for name in current if name not in targets.LEGACY_NAMES]
    added = [name for name in current if name in targets.LEGACY_NAMES]
    logger.warning(
        "rlcollect: TorchRL %s's collectors run on rlcollect in this process and the ones it "
        "starts: %s rebound, %s added back (in %s); kept as TorchRL's: %s.",
        version,
        ", ".join(rebound),
        ", ".join(added),
        ", ".join(m for m in targets.PATCHED_MODULES if m not in patch.missing),
        ", ".join([*targets.KEPT_AS_TORCHRL, *patch.missing]),
    )
    os.environ[child_environment.ANNOUNCED_VARIABLE] = "1"


def patch_torchrl(*, children: bool = True) -> None:
    """Bind TorchRL's collector classes to rlcollect's, where TorchRL's code, its trainers and
    Hydra `_target_`s find them (`torchrl.collectors`, `torchrl.collectors.collectors`), and add
    back the names TorchRL removed in 0.12 (`SyncDataCollector`, ...). Imports TorchRL.

    Patching twice changes nothing. A TorchRL release the patch was not tested against gets an
    `UntestedTorchRLVersionWarning` naming it (and whatever it lacks).

    Args:
        children: also patch the processes started from now on (worker processes under any
            start method, subprocesses, the Ray workers of a cluster started later), through
            environment variables they inherit.

    Examples:
        >>> import rlcollect
        >>> rlcollect.patch_torchrl()
        >>> from torchrl.collectors import Collector, SyncDataCollector
        >>> Collector is rlcollect.Collector, SyncDataCollector is rlcollect.Collector
        (True, True)
        >>> rlcollect.unpatch_torchrl()
        >>> from torchrl.collectors import Collector
        >>> Collector is rlcollect.Collector
        False
    """
    global _applied
    with _lock:
        if _applied is not None:
            return
        import torchrl.collectors  # noqa: F401  # what the patch rebinds

        modules, missing = rebinding.importable(targets.PATCHED_MODULES)
        replacements = targets.ours()
        missing += [n for n in targets.CURRENT_NAMES if not hasattr(modules[0], n)]
        version = targets.torchrl_version()
        _check_version(version, missing)
        variables = child_environment.child_variables() if children else {}
        patch = _Patch(
            rebindings=rebinding.rebind(modules, replacements, targets.LEGACY_NAMES),
            variables_before=child_environment.set_variables(variables),
            construction_log=(
                construction_log.ConstructionLog(
                    {cls for cls in replacements.values() if cls.__module__.startswith("rlcollect")}
                )
                if construction_log.is_verbose()
                else None
            ),
            missing=missing,
        )
        _applied = patch
        _announce(version, patch)


def unpatch_torchrl() -> None:
    """Put back TorchRL's own objects (the very ones), remove the old names the patch added,
    and stop patching the processes started from now on. Unpatched, it changes nothing."""
    global _applied
    with _lock:
        if _applied is None:
            return
        rebinding.restore(_applied.rebindings)
        if _applied.construction_log is not None:
            _applied.construction_log.close()
        child_environment.restore_variables(_applied.variables_before)
        os.environ.pop(child_environment.ANNOUNCED_VARIABLE, None)
        _applied = None

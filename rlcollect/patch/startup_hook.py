"""Run at interpreter start: when `RLCOLLECT_PATCH_TORCHRL` is set, patch TorchRL's collectors
the moment `torchrl.collectors` is first imported.

This file is executed by path as `_rlcollect_patch_startup` (by the launcher's `sitecustomize`,
or by the `.pth` line that `python -m rlcollect.patch --install-hook` writes), not imported:
importing the package imports torch, and this runs in every interpreter, TorchRL user or not.
So it imports only the standard library, does nothing when the variable is unset, and a
process that never imports TorchRL's collectors never imports rlcollect either.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Mapping, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

ENABLE_VARIABLE = "RLCOLLECT_PATCH_TORCHRL"
TRUE_VALUES = ("1", "true", "yes", "on")
TRIGGER_MODULE = "torchrl.collectors"


def is_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether `RLCOLLECT_PATCH_TORCHRL` asks for the patch (1, true, yes or on)."""
    return environ.get(ENABLE_VARIABLE, "").strip().lower() in TRUE_VALUES


def patch_now() -> None:
    """Import rlcollect's patch (TorchRL's collectors are imported by now) and apply it."""
    from rlcollect.patch import patch_torchrl

    patch_torchrl()


class PatchAfterExec(importlib.abc.Loader):
    """Runs TorchRL's loader for `torchrl.collectors`, then patches what it defined."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        patch_now()

    def __getattr__(self, name: str) -> Any:  # get_code, get_source, is_package ...
        return getattr(self._loader, name)


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds `torchrl.collectors` through the finders after it and wraps its loader; leaves
    `sys.meta_path` as soon as it has (the patch is wanted once)."""

    rlcollect_patch_hook = True  # how `install` recognises one already in place

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != TRIGGER_MODULE or self not in sys.meta_path:
            return None
        following = sys.meta_path[sys.meta_path.index(self) + 1 :]
        sys.meta_path.remove(self)
        for finder in following:
            spec = getattr(finder, "find_spec", lambda *_: None)(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = PatchAfterExec(spec.loader)
                return spec
        return None


def install() -> None:
    """Patch when TorchRL's collectors are imported (now if they already are), if asked to."""
    if not is_enabled():
        return
    if any(getattr(finder, "rlcollect_patch_hook", False) for finder in sys.meta_path):
        return
    if TRIGGER_MODULE in sys.modules:
        patch_now()
    else:
        sys.meta_path.insert(0, PatchOnImport())


if __name__ == "_rlcollect_patch_startup":  # executed by path; imported, it only defines
    install()

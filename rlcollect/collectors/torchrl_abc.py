"""Our collectors count as TorchRL's `BaseCollector` (an ABC) wherever TorchRL is imported.

TorchRL's trainers and Hydra trainer configs refuse a collector that fails
`isinstance(collector, BaseCollector)`. `BaseCollector` is an `abc.ABCMeta` class, so our base
class is registered as a virtual subclass of it: every one of our collectors then passes the
check, with no TorchRL class in our hierarchy.

`import rlcollect` must not import TorchRL (it is optional, and slow to import). So the
registration happens at once when TorchRL's collectors are already imported, and otherwise
when they are: a finder on `sys.meta_path` wraps the loaders of TorchRL's modules, tries to
register after each has run, and leaves `sys.meta_path` once it has. Any TorchRL module, not
only the one defining `BaseCollector`: we may be imported while that one is half run (TorchRL
imports a module that imports us), and it is then too late to wrap its loader; the next
TorchRL module to finish (its package imports many more) registers us.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

# Where TorchRL defines `BaseCollector` (0.14), then the package that exports it (any version).
DEFINING_MODULES = ("torchrl.collectors._base", "torchrl.collectors")
BASE_NAME = "BaseCollector"

_registered: list[type] = []
_lock = threading.Lock()


def _register_in(module: ModuleType | None) -> bool:
    """Register our classes with the `BaseCollector` `module` defines; whether it did."""
    base = getattr(module, BASE_NAME, None)
    if not isinstance(base, type) or not hasattr(base, "register"):
        return False
    for cls in _registered:
        if not issubclass(cls, base):
            base.register(cls)
    return True


def _register_if_imported() -> bool:
    return any(_register_in(sys.modules.get(name)) for name in DEFINING_MODULES)


class _RegisterAfterExec(importlib.abc.Loader):
    """Runs the wrapped loader, then registers our classes with the module's `BaseCollector`."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        if _register_in(module) or _register_if_imported():
            _remove_finder()

    def __getattr__(self, name: str) -> Any:  # get_code, get_source, is_package ...
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds TorchRL's modules through the finders after it, and wraps their loader (so
    another import hook on the same module keeps working)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname.partition(".")[0] != "torchrl" or self not in sys.meta_path:
            return None
        following = sys.meta_path[sys.meta_path.index(self) + 1 :]
        for finder in following:
            spec = getattr(finder, "find_spec", lambda *_: None)(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _RegisterAfterExec(spec.loader)
                return spec
        return None


_finder = _PostImportFinder()


def _remove_finder() -> None:
    with _lock:
        if _finder in sys.meta_path:
            sys.meta_path.remove(_finder)


def register_as_torchrl_collectors(*classes: type) -> None:
    """Make `classes` (and their subclasses) virtual subclasses of TorchRL's `BaseCollector`:
    now if TorchRL's collectors are imported, else as soon as they are. Imports nothing."""
    with _lock:
        _registered.extend(cls for cls in classes if cls not in _registered)
    if _register_if_imported():
        return
    with _lock:
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)

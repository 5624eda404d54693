"""Rebind TorchRL's collector names to ours, and put back exactly what was there."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

_MISSING = object()


@dataclass(frozen=True)
class Rebinding:
    """One module attribute the patch set, and what it held before (`_MISSING`: nothing)."""

    module: ModuleType
    name: str
    original: Any
    replacement: Any

    def restore(self) -> None:
        """Put back the original object, or remove the name the patch added."""
        if self.original is _MISSING:
            if getattr(self.module, self.name, _MISSING) is self.replacement:
                delattr(self.module, self.name)
        else:
            setattr(self.module, self.name, self.original)

    @property
    def was_added(self) -> bool:
        return self.original is _MISSING


def importable(names: tuple[str, ...]) -> tuple[list[ModuleType], list[str]]:
    """The modules of `names` that import here, and the names of those that do not."""
    found, missing = [], []
    for name in names:
        try:
            found.append(importlib.import_module(name))
        except ImportError:
            missing.append(name)
    return found, missing


def rebind(
    modules: list[ModuleType], replacements: dict[str, Any], added: tuple[str, ...]
) -> list[Rebinding]:
    """Set each of `replacements` on each module that has the name (TorchRL's class there), or
    lacks it and the name is one of `added` (an old name TorchRL removed; it joins the
    module's `__all__` too). Returns what each held, to restore."""
    done = []
    for module in modules:
        for name, replacement in replacements.items():
            original = getattr(module, name, _MISSING)
            if original is replacement or (original is _MISSING and name not in added):
                continue
            setattr(module, name, replacement)
            done.append(Rebinding(module, name, original, replacement))
            exported = getattr(module, "__all__", None)
            if original is _MISSING and isinstance(exported, list) and name not in exported:
                exported.append(name)
    return done


def restore(rebindings: list[Rebinding]) -> None:
    """Undo `rebindings`, last first; names the patch appended to `__all__` go too."""
    for rebinding in reversed(rebindings):
        rebinding.restore()
        exported = getattr(rebinding.module, "__all__", None)
        if rebinding.was_added and isinstance(exported, list) and rebinding.name in exported:
            exported.remove(rebinding.name)

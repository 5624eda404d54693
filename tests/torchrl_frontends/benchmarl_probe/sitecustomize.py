"""A probe for tests/torchrl_frontends/test_benchmarl.py: with this folder on `PYTHONPATH`, a
BenchMARL run prints the class of the collector its `Experiment` built, whichever command started
it (`python -m rlcollect.patch -m benchmarl.run ...` included).

It waits for `benchmarl.experiment.experiment` to be imported, then wraps
`Experiment._setup_collector`; nothing else is touched, and it imports only the standard library
until BenchMARL is imported. Then it runs the `sitecustomize` it hides, if any.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

# The line the probe prints, followed by the built collector's `module.qualname`.
BUILT = "benchmarl built its collector from"
WATCHED = "benchmarl.experiment.experiment"
HERE = os.path.dirname(os.path.abspath(__file__))


def report_built_collector(module: ModuleType) -> None:
    """Make BenchMARL's `Experiment` print the class of each collector it builds."""
    setup_collector = module.Experiment._setup_collector

    def setup_and_report(experiment: Any) -> None:
        setup_collector(experiment)
        built = type(experiment.collector)
        sys.stdout.write(f"{BUILT} {built.__module__}.{built.__qualname__}\n")
        sys.stdout.flush()

    module.Experiment._setup_collector = setup_and_report


class ReportAfterExec(importlib.abc.Loader):
    """Runs the module's own loader, then installs the report."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        report_built_collector(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class ReportOnImport(importlib.abc.MetaPathFinder):
    """Wraps the loader of BenchMARL's experiment module, found by the finders after it."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != WATCHED or self not in sys.meta_path:
            return None
        following = sys.meta_path[sys.meta_path.index(self) + 1 :]
        sys.meta_path.remove(self)
        for finder in following:
            spec = getattr(finder, "find_spec", lambda *_: None)(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = ReportAfterExec(spec.loader)
                return spec
        return None


def run_hidden_sitecustomize() -> None:
    """Run the `sitecustomize` that this folder, first on the path, hides."""
    elsewhere = [entry for entry in sys.path if os.path.abspath(entry or ".") != HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", elsewhere)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # not when pytest imports this file to collect doctests
    sys.meta_path.insert(0, ReportOnImport())
    run_hidden_sitecustomize()

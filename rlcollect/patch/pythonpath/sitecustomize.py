"""The folder of this file goes first on `PYTHONPATH` under `python -m rlcollect.patch` (and
after `rlcollect.patch_torchrl()`), so every interpreter of the run, worker processes and Ray
workers included, runs rlcollect's startup hook; then the `sitecustomize` it hides, if any.

Standard library only, and nothing at all when `RLCOLLECT_PATCH_TORCHRL` is unset: see
`rlcollect/patch/startup_hook.py`.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
HOOK = os.path.join(os.path.dirname(HERE), "startup_hook.py")


def run_startup_hook() -> None:
    with open(HOOK, encoding="utf-8") as source:
        code = compile(source.read(), HOOK, "exec")
    exec(code, {"__name__": "_rlcollect_patch_startup", "__file__": HOOK})


def run_hidden_sitecustomize() -> None:
    """Run the `sitecustomize` that putting this folder first on the path hides."""
    elsewhere = [entry for entry in sys.path if os.path.abspath(entry or ".") != HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", elsewhere)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # not when a test collector imports this file
    run_startup_hook()
    run_hidden_sitecustomize()

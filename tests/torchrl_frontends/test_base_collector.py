"""Our collectors count as TorchRL's `BaseCollector` once TorchRL is imported, in either
order, and `import rlcollect` alone imports no TorchRL (each case in a fresh interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torchrl")

ROOT = Path(__file__).resolve().parents[2]
CLASSES = "Collector, MultiSyncCollector, MultiAsyncCollector, AsyncBatchedCollector, RayCollector"


def run_python(*parts: str) -> str:
    """Run the code `parts` in a fresh interpreter that imports this checkout's rlcollect."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", "\n".join(textwrap.dedent(part) for part in parts)],
        capture_output=True,
        text=True,
        timeout=240,
        env=environment,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


CHECK = f"""
    from rlcollect import {CLASSES}
    from torchrl.collectors import BaseCollector
    ours = [{CLASSES}]
    assert all(issubclass(cls, BaseCollector) for cls in ours), ours
    from rlcollect.collectors import torchrl_abc
    assert torchrl_abc._finder not in sys.meta_path  # done: the hook left
"""


@pytest.mark.timeout(300)
def test_import_rlcollect_imports_no_torchrl_then_torchrl_sees_ours() -> None:
    run_python(
        """
        import sys
        import rlcollect
        from rlcollect import Collector
        loaded = [name for name in sys.modules if name.split(".")[0] == "torchrl"]
        assert not loaded, loaded
        import torchrl.trainers  # imports torchrl.collectors
        """,
        CHECK,
    )


@pytest.mark.timeout(300)
def test_torchrl_first_then_rlcollect() -> None:
    run_python("import sys\nimport torchrl.collectors\nimport rlcollect", CHECK)


@pytest.mark.timeout(300)
def test_rlcollect_imported_while_torchrl_collectors_is_half_run() -> None:
    """An import hook that imports rlcollect from inside TorchRL's import (TorchRL's
    `torchrl.collectors._base` imports `torchrl.weight_update`; here a hook on that one
    imports rlcollect, as a rebinding plug-in does): BaseCollector is not defined yet then."""
    run_python(
        """
        import importlib.abc, importlib.machinery, sys

        class Loader(importlib.abc.Loader):
            def __init__(self, loader):
                self.loader = loader
            def create_module(self, spec):
                return self.loader.create_module(spec)
            def exec_module(self, module):
                self.loader.exec_module(module)
                half_run = sys.modules["torchrl.collectors._base"]
                assert not hasattr(half_run, "BaseCollector")
                import rlcollect

        class Finder(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name != "torchrl.weight_update":
                    return None
                spec = importlib.machinery.PathFinder.find_spec(name, path)
                spec.loader = Loader(spec.loader)
                return spec

        sys.meta_path.insert(0, Finder())
        import torchrl.collectors
        assert "rlcollect" in sys.modules
        """,
        CHECK,
    )


@pytest.mark.timeout(300)
def test_an_instance_passes_the_trainers_check() -> None:
    run_python(
        """
        import rlcollect
        from torchrl.collectors import BaseCollector
        from torchrl.envs.libs.gym import GymEnv
        collector = rlcollect.Collector(GymEnv("CartPole-v1"), None, frames_per_batch=8)
        assert isinstance(collector, BaseCollector)
        collector.shutdown()
        """
    )

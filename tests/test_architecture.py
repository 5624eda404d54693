"""The package's layers (DESIGN.md, `[tool.importlinter]` in pyproject.toml) hold: every import
runs down the layers, Ray never imports multi-process code, no siblings import each other in a
circle. `lint-imports` checks them from the source, without importing it."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def lint_imports(*arguments: str) -> subprocess.CompletedProcess[str]:
    executable = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert executable, "lint-imports is missing: the test extra installs import-linter"
    return subprocess.run(
        [executable, "--no-cache", *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.timeout(150)
def test_every_import_contract_is_kept() -> None:
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 kept, 0 broken" in result.stdout, result.stdout


def lint_imports_with(tmp_path: Path, module: str, line: str) -> subprocess.CompletedProcess[str]:
    """lint-imports on a copy of the package where `module` (a path under rlcollect/) gains
    the import `line`."""
    config = (ROOT / "pyproject.toml").read_text()
    package = tmp_path / "rlcollect"
    shutil.copytree(ROOT / "rlcollect", package, ignore=shutil.ignore_patterns("__pycache__"))
    changed = package / module
    changed.write_text(changed.read_text() + f"\n{line}  # noqa\n")
    (tmp_path / "pyproject.toml").write_text(config)
    executable = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert executable
    return subprocess.run(
        [executable, "--no-cache"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PYTHONPATH": str(tmp_path), "PATH": str(Path(sys.executable).parent)},
    )


@pytest.mark.timeout(150)
def test_an_arrow_running_back_up_breaks_the_contract(tmp_path: Path) -> None:
    """The check has teeth: an import from the policy room up into the weights room (the
    direction REDESIGN forbids) is reported."""
    result = lint_imports_with(
        tmp_path,
        "collectors/policy/resolve.py",
        "from rlcollect.collectors.weights import schemes",
    )
    assert result.returncode != 0, result.stdout
    assert "rlcollect.collectors.policy.resolve -> rlcollect.collectors.weights" in result.stdout


@pytest.mark.timeout(150)
def test_the_ray_evaluation_backend_importing_the_process_worker_breaks_the_contract(
    tmp_path: Path,
) -> None:
    result = lint_imports_with(
        tmp_path,
        "collectors/evaluation/ray_actor.py",
        "from rlcollect.collectors.evaluation import worker",
    )
    assert result.returncode != 0, result.stdout
    assert (
        "rlcollect.collectors.evaluation.ray_actor is not allowed to import "
        "rlcollect.collectors.evaluation.worker"
    ) in " ".join(result.stdout.split())  # lint-imports wraps long lines


def imported_modules(path: Path) -> set[str]:
    """The `rlcollect` modules `path` imports (absolute imports, as the package writes them)."""
    tree = ast.parse(path.read_text())
    return {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlcollect")
    }


def test_rllibs_door_samples_on_the_engine() -> None:
    """The door imports the engine's loop and env (it adds no loop of its own for single-agent
    sampling: `tests/rllib/test_engine_door.py` shows it running)."""
    door = ROOT / "rlcollect" / "rllib"
    imported = set().union(*(imported_modules(path) for path in door.glob("*.py")))
    assert "rlcollect.collectors.rollout" in imported
    assert "rlcollect.collectors.policy.holder" in imported
    assert {"rlcollect.envs.gym_vector", "rlcollect.envs.envpool_env"} <= imported


@pytest.mark.timeout(150)
def test_the_engine_importing_rllibs_door_breaks_the_contract(tmp_path: Path) -> None:
    result = lint_imports_with(tmp_path, "collectors/rollout.py", "import rlcollect.rllib")
    assert result.returncode != 0, result.stdout
    assert "rlcollect.collectors.rollout -> rlcollect.rllib" in result.stdout

"""No import circle among the modules of `rlcollect.envs`, nor among those of
`rlcollect.transforms` (REDESIGN 3.4): every import counts, at module level, inside a function
or under `TYPE_CHECKING`, as import-linter and grimp count them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "rlcollect"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that the file at `path` imports (`from p import m` counts as
    `p.m` when that is a module, else as `p`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in known else node.module)
    return found & known


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of `graph` (module -> the modules it imports), or None."""
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                return [*path[path.index(imported) :], imported]
            if imported not in state:
                circle = visit(imported, [*path, imported])
                if circle:
                    return circle
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            circle = visit(module, [module])
            if circle:
                return circle
    return None


@pytest.mark.parametrize("package", ["envs", "transforms"])
def test_no_import_circle_inside_the_package(package: str) -> None:
    paths = {module_name(path): path for path in (ROOT / package).glob("*.py")}
    graph = {name: imported_modules(path, set(paths)) - {name} for name, path in paths.items()}
    assert find_circle(graph) is None, " -> ".join(find_circle(graph) or [])


def test_the_checker_sees_a_circle() -> None:
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set()}) is None

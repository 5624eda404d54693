"""Fixtures of the example tests: the scripts imported in process, as `python examples/x.py`
would see them (with `examples/` on sys.path)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from tests.examples.script_runner import EXAMPLES


@pytest.fixture(scope="session")
def scripts() -> Iterator[dict[str, ModuleType]]:
    """The example scripts as modules: `scripts["ppo"].check_config(cfg)`, ..."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield {name: importlib.import_module(name) for name in ("ppo", "dqn", "collect")}
    finally:
        sys.path.remove(str(EXAMPLES))

"""Hydra's global `ConfigStore` kept as our example scripts expect, while TorchRL's configs
are imported and composed.

Importing `torchrl.trainers.algorithms.configs` registers TorchRL's config groups (`logger`,
`collector`, `env`, ...) in the one `ConfigStore` of the process, and the examples' configs
would then compose over TorchRL's entries of the same group (`logger.exp_name` in our CSV
logger). Every pytest-xdist worker collects every test module, so an import at module level
reaches the examples' tests in all of them. Tests that need TorchRL's configs import them
through `import_torchrl_configs()` and compose with the `torchrl_config_store` fixture.

Entries are put back or taken out one by one: Hydra itself registers its plugins' configs
(`hydra/sweeper/basic`, ...) in the same store the first time it composes, and those stay.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

Path = tuple[str, ...]
_torchrl_entries: dict[Path, Any] | None = None


def _store() -> Any:
    from hydra.core.config_store import ConfigStore

    return ConfigStore.instance()


def _entries(tree: dict[str, Any], prefix: Path = ()) -> dict[Path, Any]:
    """Every config node of the store's nested groups, by its path."""
    found: dict[Path, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            found |= _entries(value, (*prefix, key))
        else:
            found[(*prefix, key)] = value
    return found


def _put(path: Path, node: Any) -> None:
    group = _store().repo
    for key in path[:-1]:
        group = group.setdefault(key, {})
    group[path[-1]] = node


def _take(path: Path) -> None:
    """Remove the entry at `path`, and the groups it leaves empty."""
    groups = [_store().repo]
    for key in path[:-1]:
        groups.append(groups[-1][key])
    del groups[-1][path[-1]]
    for parent, key in zip(reversed(groups[:-1]), reversed(path[:-1]), strict=True):
        if parent[key]:
            break
        del parent[key]


def _restore(before: dict[Path, Any], keep: tuple[str, ...] = ("hydra",)) -> None:
    """The store's entries as in `before`, but for new ones under the groups `keep`."""
    now = _entries(_store().repo)
    for path in now:
        if path not in before and path[0] not in keep:
            _take(path)
    for path, node in before.items():
        if now.get(path) is not node:
            _put(path, node)


def import_torchrl_configs() -> None:
    """Import TorchRL's config classes without leaving its registrations in the store; what
    they registered is kept aside for `torchrl_config_store`."""
    global _torchrl_entries
    if _torchrl_entries is not None:
        return
    before = _entries(_store().repo)
    import torchrl.trainers.algorithms.configs  # noqa: F401 - registers its groups

    after = _entries(_store().repo)
    _torchrl_entries = {path: node for path, node in after.items() if before.get(path) is not node}
    _restore(before, keep=())


@pytest.fixture
def torchrl_config_store() -> Iterator[None]:
    """TorchRL's config groups in the store for one test; afterwards the store as it was,
    with what Hydra registered for itself meanwhile."""
    import_torchrl_configs()
    assert _torchrl_entries is not None
    before = _entries(_store().repo)
    for path, node in _torchrl_entries.items():
        _put(path, node)
    yield
    _restore(before)

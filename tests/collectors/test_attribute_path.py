"""`resolve_attribute_path`: the paths TorchRL's `cascade_execute` and `get_model` take."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlcollect.collectors.attribute_path import resolve_attribute_path

ROOT = SimpleNamespace(
    _receiver_schemes={"policy": SimpleNamespace(interval=3)},
    env=SimpleNamespace(transform=["first", SimpleNamespace(module="net")]),
)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("_receiver_schemes['policy'].interval", 3),
        ('_receiver_schemes["policy"].interval', 3),
        ("env.transform[0]", "first"),
        ("env.transform[-1].module", "net"),
    ],
)
def test_paths_of_attributes_and_subscripts(path: str, expected: object) -> None:
    assert resolve_attribute_path(ROOT, path) == expected


@pytest.mark.parametrize(
    ("path", "error", "match"),
    [
        ("", ValueError, "attribute path is empty"),
        (".env", ValueError, r"'\.env' cannot be read at position 0"),
        ("env transform", ValueError, r"cannot be read at position 3"),
        ("env.missing", AttributeError, r"'env.missing': 'missing' does not exist"),
        ("_receiver_schemes['value']", KeyError, r"value.* does not exist on dict"),
        ("env.transform[5]", IndexError, r"5 does not exist on list"),
    ],
)
def test_bad_paths_name_the_step(path: str, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        resolve_attribute_path(ROOT, path)

"""Arguments fanned out to children (worker processes, Ray actors, sub-envs): one value for
all of them, or a list of one value per child."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def is_sequence(value: Any) -> bool:
    """Whether `value` is a list of per-child values (a sequence, not a string)."""
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def per_child(
    name: str, value: Any, count: int, count_name: str = "num_workers", child: str = "worker"
) -> list[Any]:
    """`value` repeated for each of `count` children, or `value` itself when it is a list (or
    tuple) of one entry per child.

    Raises:
        ValueError: a list of the wrong length, naming `name` and `count_name=count`.
    """
    if isinstance(value, list | tuple):
        if len(value) != count:
            raise ValueError(
                f"{name} is a list of {len(value)} entries but {count_name}={count}; give "
                f"one entry per {child}, or a single value for all."
            )
        return list(value)
    return [value] * count

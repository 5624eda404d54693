"""`RLCOLLECT_PATCH_VERBOSE=1`: one line for every collector built through a patched name,
naming the class built and the process, so a run shows where our classes stand in for TorchRL's.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterable
from typing import Any

from rlcollect.patch.startup_hook import TRUE_VALUES

VERBOSE_VARIABLE = "RLCOLLECT_PATCH_VERBOSE"
logger = logging.getLogger("rlcollect.patch")


def is_verbose() -> bool:
    """Whether `RLCOLLECT_PATCH_VERBOSE` asks for a line per collector built."""
    return os.environ.get(VERBOSE_VARIABLE, "").strip().lower() in TRUE_VALUES


def _first_logged(classes: frozenset[type], built: type) -> type | None:
    """The nearest of `classes` `built` derives from: its `__init__` is the one that logs."""
    return next((cls for cls in built.__mro__ if cls in classes), None)


def _logging_init(owner: type, init: Callable[..., None], classes: frozenset[type]) -> Any:
    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        if _first_logged(classes, type(self)) is owner:
            built = type(self)
            logger.warning(
                "rlcollect.patch: pid %d built %s.%s",
                os.getpid(),
                built.__module__,
                built.__qualname__,
            )
        init(self, *args, **kwargs)

    return __init__


class ConstructionLog:
    """Wraps the `__init__` of each class given, and unwraps it on `close()`."""

    def __init__(self, classes: Iterable[type]) -> None:
        logged = frozenset(classes)
        self._saved = [(cls, cls.__dict__.get("__init__")) for cls in logged]
        # Each wrapper calls the `__init__` its class had before any was wrapped (its own or a
        # parent's), never a parent's wrapper: one line per construction.
        before = {cls: getattr(cls, "__init__") for cls in logged}  # noqa: B009  # mypy: not cls.__init__
        for cls in logged:
            cls.__init__ = _logging_init(cls, before[cls], logged)  # type: ignore[misc]

    def close(self) -> None:
        """Give each class back its own `__init__` (or none, where it inherited one)."""
        for cls, own in reversed(self._saved):
            if own is None:
                del cls.__init__
            else:
                cls.__init__ = own  # type: ignore[misc]

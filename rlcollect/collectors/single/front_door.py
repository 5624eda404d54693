"""The front door: `Collector(..., num_collectors=N, backend=..., sync=...)` builds the
multi-process or Ray collector, as TorchRL 0.14's `Collector` does.

`Collector.__new__` hands its selector arguments here. The backends that run the loop
elsewhere live in rooms above this one (`multiprocess/`, `ray/`), so they register a builder
at import (`register_backend`) instead of being imported from here; `rlcollect.collectors`
imports both rooms, so the registry is full before any collector is built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rlcollect.runtime.fan_out import is_sequence

DIRECT = "direct"
# TorchRL's backends; "rpc", "distributed" and "submitit" have no rlcollect collector.
TORCHRL_BACKENDS = ("direct", "process", "ray", "rpc", "distributed", "submitit")
SELECTORS = ("backend", "backend_options", "num_collectors", "sync")
# What TorchRL refuses inside backend_options (they select, they do not configure).
RESERVED_OPTIONS = ("backend_options", "num_collectors", "num_workers", "sync")

# A builder takes the positional arguments (with `create_env_fn` already one maker per
# collector), the keyword arguments, the number of collectors and `sync`.
Builder = Callable[[tuple[Any, ...], dict[str, Any], int, bool], Any]
_BUILDERS: dict[str, Builder] = {}


def register_backend(name: str, build: Builder) -> None:
    """Make `Collector(..., backend=name)` build its collector with `build` (what the rooms
    above `single/` call at import)."""
    _BUILDERS[name] = build


def available_backends() -> list[str]:
    """The backends `Collector(backend=...)` accepts here."""
    return [DIRECT, *sorted(_BUILDERS)]


@dataclass(frozen=True)
class BackendChoice:
    """The validated selector arguments of one `Collector(...)` call."""

    backend: str
    num_collectors: int | None
    sync: bool
    options: dict[str, Any]

    @classmethod
    def of(
        cls,
        backend: Any,
        backend_options: Mapping[str, Any] | None,
        num_collectors: Any,
        sync: Any,
    ) -> BackendChoice:
        """Check the selectors as TorchRL does: `num_collectors` alone selects "process".

        Raises:
            TypeError: `num_collectors` not an int, `sync` not a bool.
            ValueError: an unknown backend, a non-positive `num_collectors`, or an option
                that only a non-direct backend takes.
        """
        if num_collectors is not None and (
            isinstance(num_collectors, bool) or not isinstance(num_collectors, int)
        ):
            raise TypeError(f"num_collectors must be a positive int; got {num_collectors!r}.")
        if num_collectors is not None and num_collectors < 1:
            raise ValueError(f"num_collectors={num_collectors} must be at least 1.")
        if sync is not None and not isinstance(sync, bool):
            raise TypeError(f"sync must be True, False or None; got {sync!r}.")
        if backend is None:
            backend = "process" if num_collectors is not None else DIRECT
        if backend not in available_backends():
            raise ValueError(
                f"Collector has no backend={backend!r}; use one of {available_backends()}"
                + _missing_backend_hint(backend)
            )
        options = dict(backend_options or {})
        reserved = sorted(set(RESERVED_OPTIONS) & set(options))
        if reserved:
            raise ValueError(
                f"backend_options holds the selector arguments {reserved}; pass them to "
                "Collector(...) itself."
            )
        if backend == DIRECT:
            cls._check_direct(num_collectors, sync, options)
        return cls(backend, num_collectors, bool(sync), options)

    @staticmethod
    def _check_direct(num_collectors: int | None, sync: bool | None, options: dict) -> None:
        if num_collectors not in (None, 1):
            raise ValueError(
                f"backend='direct' runs one collector in this process; got "
                f"num_collectors={num_collectors}. Use backend='process' or 'ray'."
            )
        if sync is not None:
            raise ValueError("sync is for backend='process' or 'ray'; drop it for 'direct'.")
        if options:
            raise ValueError(
                f"backend_options {sorted(options)} are for backend='process' or 'ray'; drop "
                "them for 'direct'."
            )


def _missing_backend_hint(backend: Any) -> str:
    if backend in TORCHRL_BACKENDS:
        return f" (TorchRL's {backend!r} backend has no rlcollect counterpart)."
    return "."


def build_elsewhere(
    is_front_door: bool,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    selectors: Mapping[str, Any],
) -> Any:
    """The collector `Collector(*args, **selectors, **kwargs)` stands for when it runs its
    loops elsewhere, or None when `Collector` itself is to be built (the direct backend).

    Args:
        is_front_door: whether the class called is `Collector` itself (its subclasses take no
            selector arguments, as in TorchRL).
        args: at most `create_env_fn` and `policy`.
        kwargs: the other keyword arguments.
        selectors: `backend`, `backend_options`, `num_collectors` and `sync`.

    Raises:
        TypeError: selector arguments given to a subclass, or more than two positional ones.
        ValueError: see `BackendChoice.of`; options given twice; `create_env_fn` of another
            length than `num_collectors`.
    """
    given = {name: value for name, value in selectors.items() if value is not None}
    if not is_front_door:
        if given:
            raise TypeError(
                f"{sorted(given)} select a backend only when Collector itself is built; a "
                "subclass of Collector always runs in this process."
            )
        return None
    if len(args) > 2:
        raise TypeError(
            f"Collector takes create_env_fn and policy positionally; got {len(args)} "
            "positional arguments. Pass the others by keyword."
        )
    choice = BackendChoice.of(**{name: selectors.get(name) for name in SELECTORS})
    if choice.backend == DIRECT:
        return None
    duplicated = sorted(
        set(choice.options) & (set(kwargs) | set(("create_env_fn", "policy")[: len(args)]))
    )
    if duplicated:
        raise ValueError(
            f"backend_options repeats {duplicated}, also given to Collector(...); give each once."
        )
    kwargs = {**kwargs, **choice.options}
    args, num_collectors = _one_maker_per_collector(args, kwargs, choice.num_collectors)
    return _BUILDERS[choice.backend](args, kwargs, num_collectors, choice.sync)


def _one_maker_per_collector(
    args: tuple[Any, ...], kwargs: dict[str, Any], num_collectors: int | None
) -> tuple[tuple[Any, ...], int]:
    """`create_env_fn` as a list of one env maker per collector (in `args` or `kwargs`, where
    it was given), and how many collectors that is."""
    in_args = bool(args)
    if not in_args and "create_env_fn" not in kwargs:
        raise TypeError("Collector needs create_env_fn (an env, an env maker or a Gymnasium id).")
    makers = args[0] if in_args else kwargs["create_env_fn"]
    if is_sequence(makers):
        makers = list(makers)
        if not makers:
            raise ValueError("create_env_fn is an empty list; give at least one env maker.")
        if num_collectors is not None and num_collectors != len(makers):
            raise ValueError(
                f"num_collectors={num_collectors} but create_env_fn lists {len(makers)} env "
                "makers; make them agree or drop num_collectors."
            )
    else:
        makers = [makers] * (num_collectors or 1)
    if in_args:
        return (makers, *args[1:]), len(makers)
    kwargs["create_env_fn"] = makers
    return args, len(makers)


def one_env_maker(create_env_fn: Any) -> Any:
    """`create_env_fn` for a collector in this process: a list of one maker is that maker
    (TorchRL's direct backend takes one).

    Raises:
        ValueError: a list of another length.
    """
    if not is_sequence(create_env_fn):
        return create_env_fn
    if len(create_env_fn) != 1:
        raise ValueError(
            f"Collector runs one env maker in this process; create_env_fn lists "
            f"{len(create_env_fn)}. Pass num_collectors={len(create_env_fn)} (or "
            "backend='process') for one collector per maker, or batch them with SerialEnv / "
            "ParallelEnv."
        )
    return create_env_fn[0]

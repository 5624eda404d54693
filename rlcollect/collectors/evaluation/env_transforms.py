"""What an evaluation does to its env's transforms: freeze running statistics, dump recordings.

Both walk the transforms of an env (ours or TorchRL's: a `.transform`, a `Compose` of them, a
`.base_env` that may be transformed too) and act on those that have the method, so any
transform that keeps running statistics (`freeze()`) or records (`dump(step=...)`) takes part.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def is_transformed(env: Any) -> bool:
    """Whether `env` is a `TransformedEnv` (ours or TorchRL's). Asked of the class: a batched
    env forwards unknown attributes to its sub-envs, so `getattr` cannot tell."""
    return any(cls.__name__ == "TransformedEnv" for cls in type(env).__mro__)


def transformed_layers(env: Any) -> Iterator[Any]:
    """`env` and the transformed envs it wraps, outermost first, while they are transformed."""
    while is_transformed(env):
        yield env
        env = env.base_env


def env_transforms(env: Any) -> Iterator[Any]:
    """Every transform of `env`, outermost env first, `Compose` chains opened."""
    for layer in transformed_layers(env):
        yield from _opened(layer.transform)


def _opened(transform: Any) -> Iterator[Any]:
    """`transform` itself, and what it chains (a `Compose` is iterable over its transforms)."""
    yield transform
    if type(transform).__name__ == "Compose":
        for inner in transform:
            yield from _opened(inner)


def freeze_running_statistics(env: Any) -> Any:
    """Freeze every transform of `env` that keeps running statistics (TorchRL's `VecNorm`,
    `VecNormV2`: a `freeze()` method), so that evaluation episodes do not move them; returns
    `env`. Training sends the statistics along with the weights (`weights_dict`)."""
    for transform in env_transforms(env):
        freeze = getattr(transform, "freeze", None)
        if callable(freeze):
            freeze()
    return env


def dump_recordings(env: Any, step: int) -> None:
    """Tell every recording transform of `env` (TorchRL's `VideoRecorder`: a `dump()`
    method) to write what it recorded, at logging step `step`. A chain with a `dump()` of its
    own (TorchRL's `Compose`) forwards the call itself; ours is opened."""
    for layer in transformed_layers(env):
        for dump in _dumps(layer.transform):
            dump(step=step)


def _dumps(transform: Any) -> Iterator[Any]:
    dump = getattr(transform, "dump", None)
    if callable(dump):
        yield dump
    elif type(transform).__name__ == "Compose":
        for inner in transform:
            yield from _dumps(inner)

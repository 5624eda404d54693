"""Tensor specs: the shape, dtype, device and domain of every tensor an env reads or writes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

DeviceLike = torch.device | str | int | None
ShapeLike = torch.Size | Sequence[int] | int


def _as_shape(shape: ShapeLike) -> torch.Size:
    if isinstance(shape, int):
        return torch.Size([shape])
    return torch.Size(shape)


class TensorSpec:
    """The description of one tensor leaf: `shape` (env batch dims first), `dtype` and `device`.

    Subclasses define the domain: `rand()` draws from it, `zero()` gives a valid zero-like value and
    `is_in()` tells whether a tensor belongs to it.
    """

    def __init__(self, shape: ShapeLike, dtype: torch.dtype, device: DeviceLike = None) -> None:
        self.shape = _as_shape(shape)
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else torch.device("cpu")

    def rand(self, shape: ShapeLike = ()) -> torch.Tensor:
        """A random value of `shape + self.shape` in the spec's domain."""
        raise NotImplementedError

    def zero(self, shape: ShapeLike = ()) -> torch.Tensor:
        """A zero-filled value of `shape + self.shape`."""
        return torch.zeros((*_as_shape(shape), *self.shape), dtype=self.dtype, device=self.device)

    def is_in(self, value: torch.Tensor) -> bool:
        """Whether `value` has this spec's trailing shape and dtype, and lies in its domain."""
        if not isinstance(value, torch.Tensor) or value.dtype != self.dtype:
            return False
        if value.shape[value.ndim - len(self.shape) :] != self.shape:
            return False
        return self._in_domain(value)

    def _in_domain(self, value: torch.Tensor) -> bool:
        return True

    def expand(self, *batch: int) -> TensorSpec:
        """The same spec with batch dims `batch` prepended (used to batch per-env specs)."""
        clone = self.clone()
        clone.shape = torch.Size([*batch, *self.shape])
        return clone

    def clone(self) -> TensorSpec:
        """A shallow copy that can be reshaped or moved without touching this spec."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def to(self, device: DeviceLike) -> TensorSpec:
        """The same spec on `device`."""
        clone = self.clone()
        clone.device = torch.device(device) if device is not None else torch.device("cpu")
        return clone

    def __eq__(self, other: object) -> bool:
        if type(self) is not type(other):
            return False
        if self.shape != other.shape or self.dtype != other.dtype:  # type: ignore[attr-defined]
            return False
        # the domain (bounds, number of choices) is part of the spec; the device is not
        return all(
            same_attribute(value, other.__dict__.get(name))
            for name, value in self.__dict__.items()
            if name not in ("shape", "dtype", "device")
        )

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(self.shape), self.dtype))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={tuple(self.shape)}, dtype={self.dtype})"


def same_attribute(first: object, second: object) -> bool:
    """Equality of two spec attributes, comparing tensors by shape and values."""
    if isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor):
        return first.shape == second.shape and bool(torch.equal(first.cpu(), second.cpu()))
    return first == second


class Unbounded(TensorSpec):
    """Any value of the given shape and dtype.

    Examples:
        >>> Unbounded(shape=(1,)).zero()
        tensor([0.])
    """

    def __init__(
        self, shape: ShapeLike = (), dtype: torch.dtype = torch.float32, device: DeviceLike = None
    ) -> None:
        super().__init__(shape, dtype, device)

    def rand(self, shape: ShapeLike = ()) -> torch.Tensor:
        full = (*_as_shape(shape), *self.shape)
        if self.dtype.is_floating_point:
            return torch.randn(full, dtype=self.dtype, device=self.device)
        if self.dtype == torch.bool:
            return torch.randint(0, 2, full, device=self.device).bool()
        return torch.randint(-100, 100, full, dtype=self.dtype, device=self.device)


class Bounded(TensorSpec):
    """Values between `low` and `high` (inclusive), element-wise.

    Examples:
        >>> spec = Bounded(low=-2.0, high=2.0, shape=(1,))
        >>> bool(spec.is_in(spec.rand()))
        True
    """

    def __init__(
        self,
        low: float | torch.Tensor,
        high: float | torch.Tensor,
        shape: ShapeLike = (),
        dtype: torch.dtype = torch.float32,
        device: DeviceLike = None,
    ) -> None:
        super().__init__(shape, dtype, device)
        self.low = torch.as_tensor(low, dtype=dtype, device=self.device).expand(self.shape).clone()
        self.high = (
            torch.as_tensor(high, dtype=dtype, device=self.device).expand(self.shape).clone()
        )
        if (self.low > self.high).any():
            raise ValueError(f"Bounded spec needs low <= high; got low={low} and high={high}.")

    def rand(self, shape: ShapeLike = ()) -> torch.Tensor:
        """Uniform where both bounds are finite (integers: each value in `[low, high]` alike);
        otherwise as Gymnasium's `Box.sample`:
        `low + Exp(1)` or `high - Exp(1)` for one infinite bound, `N(0, 1)` for two."""
        full = (*_as_shape(shape), *self.shape)
        low, high = self.low.double().expand(full), self.high.double().expand(full)
        uniform = torch.rand(full, dtype=torch.float64, device=self.device)
        if not self.dtype.is_floating_point:  # integer bounds are finite: uniform, inclusive
            value = low + torch.floor(uniform * (high - low + 1))
            return value.clamp(low, high).to(self.dtype)
        low_finite, high_finite = torch.isfinite(low), torch.isfinite(high)
        exponential = -torch.log1p(-uniform)
        value = torch.where(
            low_finite & high_finite,
            low + uniform * (high - low),
            torch.where(
                low_finite,
                low + exponential,
                torch.where(high_finite, high - exponential, torch.randn_like(uniform)),
            ),
        )
        return value.clamp(low, high).to(self.dtype)

    def zero(self, shape: ShapeLike = ()) -> torch.Tensor:
        value = super().zero(shape)
        return value.clamp(self.low, self.high) if self.dtype != torch.bool else value

    def _in_domain(self, value: torch.Tensor) -> bool:
        return bool(((value >= self.low) & (value <= self.high)).all())

    def expand(self, *batch: int) -> Bounded:
        clone = super().expand(*batch)
        clone.low = self.low.expand(clone.shape)  # type: ignore[attr-defined]
        clone.high = self.high.expand(clone.shape)  # type: ignore[attr-defined]
        return clone  # type: ignore[return-value]

    def to(self, device: DeviceLike) -> Bounded:
        clone = super().to(device)
        clone.low = self.low.to(clone.device)  # type: ignore[attr-defined]
        clone.high = self.high.to(clone.device)  # type: ignore[attr-defined]
        return clone  # type: ignore[return-value]


class Categorical(TensorSpec):
    """Integer indices in `[0, n)`; `n` may be a sequence, one bound per element (MultiDiscrete).

    Examples:
        >>> spec = Categorical(3)
        >>> spec.shape, int(spec.rand()) in (0, 1, 2)
        (torch.Size([]), True)
    """

    def __init__(
        self,
        n: int | Sequence[int] | torch.Tensor,
        shape: ShapeLike | None = None,
        dtype: torch.dtype = torch.int64,
        device: DeviceLike = None,
    ) -> None:
        bounds = torch.as_tensor(n, dtype=torch.int64)
        if shape is None:
            shape = bounds.shape
        super().__init__(shape, dtype, device)
        if (bounds <= 0).any():
            raise ValueError(f"Categorical spec needs n >= 1; got n={n}.")
        self.n = bounds.to(self.device)

    def rand(self, shape: ShapeLike = ()) -> torch.Tensor:
        full = (*_as_shape(shape), *self.shape)
        uniform = torch.rand(full, device=self.device)
        return (uniform * self.n).floor().to(self.dtype)

    def _in_domain(self, value: torch.Tensor) -> bool:
        as_int = value.long()
        return bool(((as_int >= 0) & (as_int < self.n)).all())


class OneHot(TensorSpec):
    """One-hot vectors over `n` choices; the last dim of `shape` is `n`.

    Examples:
        >>> spec = OneHot(2)
        >>> int(spec.rand().sum())
        1
    """

    def __init__(
        self,
        n: int,
        shape: ShapeLike | None = None,
        dtype: torch.dtype = torch.int64,
        device: DeviceLike = None,
    ) -> None:
        shape = _as_shape(shape) if shape is not None else torch.Size([n])
        if shape[-1] != n:
            raise ValueError(f"OneHot spec shape {tuple(shape)} must end with n={n}.")
        super().__init__(shape, dtype, device)
        self.n = n

    def rand(self, shape: ShapeLike = ()) -> torch.Tensor:
        full = (*_as_shape(shape), *self.shape[:-1])
        index = torch.randint(0, self.n, full, device=self.device)
        return torch.nn.functional.one_hot(index, self.n).to(self.dtype)

    def _in_domain(self, value: torch.Tensor) -> bool:
        as_int = value.long()
        return bool(((as_int == 0) | (as_int == 1)).all() and (as_int.sum(-1) == 1).all())

    def to_categorical(self, value: torch.Tensor) -> torch.Tensor:
        """The index of the hot entry of each one-hot vector."""
        return value.argmax(-1)


class Binary(TensorSpec):
    """Vectors of zeros and ones (MultiBinary; also the `done` flags with dtype bool).

    Examples:
        >>> Binary(4).rand().shape
        torch.Size([4])
    """

    def __init__(
        self,
        n: int | None = None,
        shape: ShapeLike | None = None,
        dtype: torch.dtype = torch.int8,
        device: DeviceLike = None,
    ) -> None:
        if shape is None:
            if n is None:
                raise ValueError("Binary spec needs n or shape; got neither.")
            shape = torch.Size([n])
        super().__init__(shape, dtype, device)
        self.n = self.shape[-1] if len(self.shape) else 1

    def rand(self, shape: ShapeLike = ()) -> torch.Tensor:
        full = (*_as_shape(shape), *self.shape)
        return torch.randint(0, 2, full, device=self.device).to(self.dtype)

    def _in_domain(self, value: torch.Tensor) -> bool:
        as_int = value.long()
        return bool(((as_int == 0) | (as_int == 1)).all())


class Composite(TensorSpec):
    """A mapping from keys to specs (possibly nested); `shape` is the shared batch shape.

    Examples:
        >>> spec = Composite(observation=Unbounded(shape=(4,)))
        >>> spec.zero()["observation"].shape
        torch.Size([4])
    """

    def __init__(
        self,
        specs: Mapping[str, TensorSpec] | None = None,
        shape: ShapeLike = (),
        device: DeviceLike = None,
        **kwargs: TensorSpec,
    ) -> None:
        super().__init__(shape, torch.float32, device)
        self._specs: dict[str, TensorSpec] = {**(specs or {}), **kwargs}

    def __getitem__(self, key: str | tuple[str, ...]) -> TensorSpec:
        if isinstance(key, tuple):
            spec: TensorSpec = self
            for part in key:
                spec = spec[part]  # type: ignore[index]
            return spec
        return self._specs[key]

    def __setitem__(self, key: str | tuple[str, ...], spec: TensorSpec) -> None:
        if isinstance(key, tuple) and len(key) > 1:
            head = key[0]
            if head not in self._specs:
                self._specs[head] = Composite(shape=self.shape, device=self.device)
            self._specs[head][key[1:]] = spec  # type: ignore[index]
            return
        name = key[0] if isinstance(key, tuple) else key
        self._specs[name] = spec

    def __delitem__(self, key: str) -> None:
        del self._specs[key]

    def __contains__(self, key: object) -> bool:
        if isinstance(key, tuple):
            try:
                self[key]
            except KeyError:
                return False
            return True
        return key in self._specs

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def keys(self, include_nested: bool = False, leaves_only: bool = False) -> list:
        """The keys, as TensorDict.keys: nested keys are tuples when `include_nested`."""
        result: list = []
        for key, spec in self._specs.items():
            is_composite = isinstance(spec, Composite)
            if not (leaves_only and is_composite):
                result.append(key)
            if include_nested and is_composite:
                nested = spec.keys(include_nested=True, leaves_only=leaves_only)  # type: ignore[attr-defined]
                result.extend((key, *(k if isinstance(k, tuple) else (k,))) for k in nested)
        return result

    def items(self) -> list[tuple[str, TensorSpec]]:
        return list(self._specs.items())

    def leaves(self) -> list[tuple[tuple[str, ...], TensorSpec]]:
        """Every leaf spec with its full key as a tuple."""
        return spec_leaves(self)

    def rand(self, shape: ShapeLike = ()) -> TensorDict:
        return self._build(lambda spec: spec.rand(shape), shape)

    def zero(self, shape: ShapeLike = ()) -> TensorDict:
        return self._build(lambda spec: spec.zero(shape), shape)

    def _build(self, make: object, shape: ShapeLike) -> TensorDict:
        data = {key: make(spec) for key, spec in self._specs.items()}  # type: ignore[operator]
        return TensorDict(data, batch_size=(*_as_shape(shape), *self.shape))

    def is_in(self, value: TensorDictBase) -> bool:  # type: ignore[override]
        return all(key in value and spec.is_in(value[key]) for key, spec in self.items())

    def expand(self, *batch: int) -> Composite:
        specs = {key: spec.expand(*batch) for key, spec in self._specs.items()}
        return Composite(specs, shape=(*batch, *self.shape), device=self.device)

    def to(self, device: DeviceLike) -> Composite:
        specs = {key: spec.to(device) for key, spec in self._specs.items()}
        return Composite(specs, shape=self.shape, device=device)

    def clone(self) -> Composite:
        specs = {key: spec.clone() for key, spec in self._specs.items()}
        return Composite(specs, shape=self.shape, device=self.device)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Composite)
            and self.shape == other.shape
            and self._specs == other._specs
        )

    __hash__ = TensorSpec.__hash__

    def __repr__(self) -> str:
        inner = ", ".join(f"{key}={spec!r}" for key, spec in self._specs.items())
        return f"Composite({inner}, shape={tuple(self.shape)})"


def spec_leaves(spec: Any) -> list[tuple[tuple[str, ...], Any]]:
    """Every leaf of a composite spec with its full key as a tuple: ours, or any spec with
    TensorDict-style `keys(include_nested=True, leaves_only=True)` such as TorchRL's."""
    result = []
    for key in spec.keys(include_nested=True, leaves_only=True):
        full = key if isinstance(key, tuple) else (key,)
        result.append((full, spec[full]))
    return result


def batch_spec(spec: Any, *batch: int) -> Any:
    """`spec` with the batch dims `batch` prepended, for our specs and TorchRL's alike
    (TorchRL's `expand` takes the whole new shape, ours the dims to prepend)."""
    if isinstance(spec, TensorSpec):
        return spec.expand(*batch)
    return spec.expand(*batch, *spec.shape)

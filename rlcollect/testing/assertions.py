"""The value checks behind `check_env`: each raises `EnvContractError` naming the key at fault."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from tensordict import TensorDictBase

from rlcollect.envs.specs import TensorSpec
from rlcollect.errors import EnvContractError

Key = str | tuple[str, ...]


def key_name(key: Key) -> str:
    """`'observation'` for a root key, `('next', 'reward')` for a nested one."""
    if isinstance(key, tuple) and len(key) == 1:
        key = key[0]
    return repr(key)


def check_value(
    where: str, key: Key, value: object, spec: TensorSpec, device: torch.device
) -> None:
    """Check that `value` is a tensor with exactly the spec's shape, dtype, device and domain."""
    name = key_name(key)
    if value is None:
        raise EnvContractError(f"{where}: key {name} is missing; the env's specs declare {spec!r}.")
    if not isinstance(value, torch.Tensor):
        raise EnvContractError(
            f"{where}: key {name} holds a {type(value).__name__}; expected a tensor ({spec!r})."
        )
    if value.shape != spec.shape:
        raise EnvContractError(
            f"{where}: key {name} has shape {tuple(value.shape)}; expected {tuple(spec.shape)} "
            f"(the env batch dims then the feature dims, as its spec {spec!r} says)."
        )
    if value.dtype != spec.dtype:
        raise EnvContractError(
            f"{where}: key {name} has dtype {value.dtype}; expected {spec.dtype} from its spec. "
            "Cast the value in the env, or fix the spec."
        )
    if value.device.type != device.type:
        raise EnvContractError(
            f"{where}: key {name} is on {value.device}; expected the env device {device}."
        )
    if not spec.is_in(value):
        raise EnvContractError(
            f"{where}: key {name} holds values outside its spec {spec!r} "
            f"(min {value.min().item()}, max {value.max().item()})."
        )


def check_entries(
    where: str,
    tensordict: object,
    leaves: Iterable[tuple[Key, TensorSpec]],
    batch_size: torch.Size,
    device: torch.device,
) -> None:
    """Check that `tensordict` has the env batch size and conforms to every `(key, spec)`."""
    if not isinstance(tensordict, TensorDictBase):
        raise EnvContractError(
            f"{where}: returned a {type(tensordict).__name__}; expected a TensorDict."
        )
    if tensordict.batch_size != batch_size:
        raise EnvContractError(
            f"{where}: returned a TensorDict of batch size {tuple(tensordict.batch_size)}; "
            f"expected the env batch size {tuple(batch_size)}."
        )
    for key, spec in leaves:
        check_value(where, key, tensordict.get(key, None), spec, device)


def tensors_equal(expected: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
    """Element-wise equality where NaN equals NaN."""
    same = expected == got
    if expected.is_floating_point():
        same |= expected.isnan() & got.isnan()
    return same


def assert_same_values(
    where: str,
    expected: TensorDictBase,
    got: TensorDictBase,
    keys: Sequence[Key],
    time_dim: int | None = None,
) -> None:
    """Check that `got` holds exactly the values of `expected` for `keys`.

    With `time_dim`, the message names the key that differs first in time, and that time step.
    """
    first: tuple[int, Key, str] | None = None
    for key in keys:
        reference, value = expected.get(key), got.get(key, None)
        if value is None:
            raise EnvContractError(f"{where}: key {key_name(key)} is missing.")
        if value.shape != reference.shape or value.dtype != reference.dtype:
            raise EnvContractError(
                f"{where}: key {key_name(key)} has shape {tuple(value.shape)} and dtype "
                f"{value.dtype}; expected {tuple(reference.shape)} and {reference.dtype}."
            )
        same = tensors_equal(reference, value)
        if bool(same.all()):
            continue
        if time_dim is None:
            raise EnvContractError(f"{where}: key {key_name(key)} differs.")
        differs = ~same.movedim(time_dim, 0).reshape(same.shape[time_dim], -1).all(-1)
        step = int(differs.nonzero()[0])
        if first is None or step < first[0]:
            detail = (
                f"got {brief(value.select(time_dim, step))}, "
                f"expected {brief(reference.select(time_dim, step))}"
            )
            first = (step, key, detail)
    if first is not None:
        step, key, detail = first
        raise EnvContractError(
            f"{where}: key {key_name(key)} differs, first at time step {step}: {detail}."
        )


def brief(value: torch.Tensor, limit: int = 120) -> str:
    """The values of a small tensor as a list, shortened to `limit` characters."""
    text = str(value.tolist())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def assert_same_keys(where: str, expected: Iterable[Key], got: Iterable[Key]) -> None:
    """Check that two key sets are the same, naming the keys that are missing or extra."""
    expected_set, got_set = set(expected), set(got)
    if expected_set == got_set:
        return
    missing = sorted(map(key_name, expected_set - got_set))
    extra = sorted(map(key_name, got_set - expected_set))
    raise EnvContractError(f"{where}: missing keys {missing}, unexpected keys {extra}.")

"""`GAEKeys`: where `GAE` reads and writes, set by TorchRL's `set_keys` names and checked."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from tensordict import NestedKey, unravel_key

from rlcollect.keys import (
    ADVANTAGE,
    DONE,
    NEXT,
    OBSERVATION,
    REWARD,
    STATE_VALUE,
    TERMINATED,
    VALUE_TARGET,
)


@dataclass(frozen=True)
class GAEKeys:
    """Where `GAE` reads and writes: TorchRL's `tensor_keys` of its value estimators.

    Attributes:
        advantage: where the advantage is written.
        value_target: where the value target is written.
        value: the value network's out key (read from the batch when there is no network).
        reward: the reward, read under `"next"`.
        done: the done flags, read under `"next"`; env-level `[*B, T, 1]` flags are broadcast
            over the agent dims of a grouped reward.
        terminated: the terminated flags, read under `"next"` (done when the batch lacks them).
        observation: what a plain `nn.Module` value network reads (a `TensorDictModule`
            reads its own in keys).
    """

    advantage: NestedKey = ADVANTAGE
    value_target: NestedKey = VALUE_TARGET
    value: NestedKey = STATE_VALUE
    reward: NestedKey = REWARD
    done: NestedKey = DONE
    terminated: NestedKey = TERMINATED
    observation: NestedKey = OBSERVATION


KEY_NAMES = tuple(field.name for field in dataclasses.fields(GAEKeys))


def replaced_keys(keys: GAEKeys, changes: dict[str, object]) -> GAEKeys:
    """`keys` with `changes` (`{name: key}`, the keyword arguments of `set_keys`) applied.

    Raises:
        TypeError: for a name not in `GAEKeys`, or a key that is not a string or a sequence
            of strings.
    """
    unknown = sorted(set(changes) - set(KEY_NAMES))
    if unknown:
        raise TypeError(
            f"set_keys got unknown names {unknown}; expected some of {list(KEY_NAMES)}, "
            "e.g. set_keys(reward=('agents', 'reward'))."
        )
    checked = {name: checked_key(name, key) for name, key in changes.items()}
    return dataclasses.replace(keys, **checked)  # type: ignore[arg-type]


def checked_key(name: str, key: object) -> NestedKey:
    """`key` as a nested key; a sequence of strings (as a config gives it) becomes a tuple.

    Raises:
        TypeError: naming `name` when `key` is not a non-empty string or sequence of them.
    """
    parts = (key,) if isinstance(key, str) else key
    if (
        not isinstance(parts, Sequence)
        or not parts
        or not all(isinstance(part, str) and part for part in parts)
    ):
        raise TypeError(
            f"set_keys({name}={key!r}): a key is a non-empty string or a tuple of them, e.g. "
            f"set_keys({name}=('agents', {getattr(GAEKeys, name)!r}))."
        )
    return unravel_key(tuple(parts))


def under_next(key: NestedKey) -> tuple[str, ...]:
    """The key `key` names under `"next"`."""
    return (NEXT, *key) if isinstance(key, tuple) else (NEXT, key)

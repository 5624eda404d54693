"""The RolloutBuffer layout (`obs`, `action`, `value`, ...) and its mapping to TorchRL's keys.

Two layouts describe one `[*B, T + 1]` on-policy rollout (batch names `[..., "time"]`):

* the **TorchRL layout**: a collector batch's keys (DESIGN.md), root entries and a `"next"`
  sub-TensorDict; slot `T` of the root holds the last observation, `"next"` slot `T` is padding;
* the **buffer layout** of the RolloutBuffer reference page: one level of named fields, every
  one of batch `[*B, T + 1]`:

  | field | shape | TorchRL key | slot `T` |
  | --- | --- | --- | --- |
  | `obs` | `[*B, T + 1, obs_dim]` float32 | `"observation"` | the last observation |
  | `action` | `[*B, T + 1, action_dim]` float32 | `"action"` | padding |
  | `sample_log_prob` | `[*B, T + 1]` float32 | `"sample_log_prob"` | padding |
  | `value` | `[*B, T + 1]` float32 | `"state_value"` | the bootstrap value of `obs[..., T]` |
  | `reward` | `[*B, T + 1]` float32 | `("next", "reward")` | padding |
  | `done`, `terminated`, `truncated` | `[*B, T + 1]` bool | `("next", <flag>)` | padding |
  | `final_value` | `[*B, T + 1]` float32 | `("next", "state_value")` where truncated | padding |

  Transition-only fields are aligned with their step: `reward[t]`, `done[t]` are those of the
  step from `obs[t]`, as TorchRL's `("next", "reward")` at `t`. `final_value` (rlcollect's
  addition to the page's fields) is the value of the observation a truncated episode ended on,
  which `obs` cannot hold (the env was reset into `obs[t + 1]`), so that GAE bootstraps a
  truncated step as TorchRL's GAE does; it is 0 at the other steps. Algorithms attach their
  own fields (`advantage`, `return` = TorchRL's `"value_target"`, `seq_mask`, `seq_return`).
  A discrete action of `n` choices is held as its index (`action_dim=1`, a float, as SB3's
  rollout buffer holds it) or as its one-hot (`action_dim=n`), whichever the env takes
  (`collectors/single/action_field.py`); `as_torchrl` gives `action` as it is held.

This module is the one place where the two layouts' names meet: the collector writes the buffer
layout through `field_of_key`, and `as_torchrl` gives TorchRL-keyed transitions of it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from enum import Enum

import torch
from tensordict import TensorDict, TensorDictBase

from rlcollect import keys

NestedKey = str | tuple[str, ...]

OBS = "obs"
ACTION = "action"
SAMPLE_LOG_PROB = "sample_log_prob"
VALUE = "value"
REWARD = "reward"
DONE = "done"
TERMINATED = "terminated"
TRUNCATED = "truncated"
FINAL_VALUE = "final_value"
# Fields an algorithm attaches (the collector never writes them).
ADVANTAGE = "advantage"
RETURN = "return"
SEQ_MASK = "seq_mask"
SEQ_RETURN = "seq_return"


class RolloutLayout(Enum):
    """The two layouts of a rollout (see the module docstring)."""

    BUFFER = "buffer"
    TORCHRL = "torchrl"


@dataclass(frozen=True)
class RolloutField:
    """One field of the buffer layout.

    Attributes:
        name: the page's name (`"obs"`).
        key: the TorchRL key it holds at every step (`"observation"`).
        dtype: its dtype.
        feature: `"obs_dim"`, `"action_dim"`, or None for one number per step.
        holds_last_slot: whether slot `T` holds data (`obs`, `value`) rather than padding.
    """

    name: str
    key: NestedKey
    dtype: torch.dtype
    feature: str | None = None
    holds_last_slot: bool = False


FIELDS = (
    RolloutField(OBS, keys.OBSERVATION, torch.float32, "obs_dim", holds_last_slot=True),
    RolloutField(ACTION, keys.ACTION, torch.float32, "action_dim"),
    RolloutField(SAMPLE_LOG_PROB, keys.SAMPLE_LOG_PROB, torch.float32),
    RolloutField(VALUE, keys.STATE_VALUE, torch.float32, holds_last_slot=True),
    RolloutField(REWARD, (keys.NEXT, keys.REWARD), torch.float32),
    RolloutField(DONE, (keys.NEXT, keys.DONE), torch.bool),
    RolloutField(TERMINATED, (keys.NEXT, keys.TERMINATED), torch.bool),
    RolloutField(TRUNCATED, (keys.NEXT, keys.TRUNCATED), torch.bool),
)
FINAL_VALUE_FIELD = RolloutField(FINAL_VALUE, (keys.NEXT, keys.STATE_VALUE), torch.float32)
# The algorithm fields and their TorchRL keys (as our GAE writes them).
ALGORITHM_KEYS = {ADVANTAGE: keys.ADVANTAGE, RETURN: keys.VALUE_TARGET}

_BY_KEY = {field.key: field for field in FIELDS}


def field_of_key(key: NestedKey) -> RolloutField | None:
    """The buffer-layout field that holds the TorchRL entry `key` at every step, if any
    (`final_value` is not one: it holds `("next", "state_value")` at truncated steps only)."""
    return _BY_KEY.get(keys.plain_key(key))


def is_buffer_layout(rollout: object) -> bool:
    """Whether `rollout` is a TensorDict in the buffer layout (it has an `obs` field)."""
    return isinstance(rollout, TensorDictBase) and isinstance(rollout.get(OBS, None), torch.Tensor)


def positive_size(name: str, value: object) -> int:
    """`value` as an int, or a ValueError naming `name` when it is not a positive int."""
    if not keys.is_int(value) or operator.index(value) <= 0:  # type: ignore[arg-type]
        raise ValueError(f"{name} must be a positive int, got {value!r}.")
    return operator.index(value)  # type: ignore[arg-type]


def allocate_rollout(
    num_envs: int,
    rollout_len: int,
    obs_dim: int,
    action_dim: int,
    device: torch.device | str = "cpu",
) -> TensorDict:
    """A zero-filled buffer-layout rollout of batch `[num_envs, rollout_len + 1]`, named
    `[None, "time"]`, with every field of `FIELDS` and `final_value`.

    Raises:
        ValueError: an argument is not a positive int, naming it.

    Examples:
        >>> rollout = allocate_rollout(num_envs=2, rollout_len=3, obs_dim=4, action_dim=1)
        >>> rollout["obs"].shape, rollout["done"].dtype
        (torch.Size([2, 4, 4]), torch.bool)
    """
    sizes = {
        "num_envs": positive_size("num_envs", num_envs),
        "rollout_len": positive_size("rollout_len", rollout_len),
        "obs_dim": positive_size("obs_dim", obs_dim),
        "action_dim": positive_size("action_dim", action_dim),
    }
    batch = (sizes["num_envs"], sizes["rollout_len"] + 1)
    rollout = TensorDict(batch_size=batch, device=device)
    for field in (*FIELDS, FINAL_VALUE_FIELD):
        feature = () if field.feature is None else (sizes[field.feature],)
        rollout.set(field.name, torch.zeros(*batch, *feature, dtype=field.dtype, device=device))
    rollout.names = [None, keys.TIME_DIM_NAME]
    return rollout


def next_values(rollout: TensorDictBase) -> torch.Tensor:
    """`[*B, T]`: the value of the observation after each step (TorchRL's
    `("next", "state_value")`): `value[t + 1]`, or `final_value[t]` where an episode ended at
    `t` (0 after a termination: the collector writes `final_value` only where truncated)."""
    steps, dim = rollout.batch_size[-1] - 1, rollout.batch_dims - 1
    value = rollout.get(VALUE)
    final = rollout.get(FINAL_VALUE, None)
    if final is None:
        raise KeyError(
            f"the rollout has no {FINAL_VALUE!r} field: the value of the last observation of "
            "each truncated episode, which GAE bootstraps from. Allocate the rollout with "
            "RolloutBuffer(num_envs, rollout_len, obs_dim, action_dim), or add a zero "
            f"{FINAL_VALUE!r} when no episode is ever truncated."
        )
    done = rollout.get(DONE).narrow(dim, 0, steps)
    return torch.where(done, final.narrow(dim, 0, steps), value.narrow(dim, 1, steps))


def torchrl_transitions(transitions: TensorDictBase) -> TensorDict:
    """Buffer-layout transitions (a transition view, flat or not, or a minibatch of one)
    under TorchRL's keys: a new TensorDict of the same batch size sharing the fields' memory.

    Each field present goes to its TorchRL key; one number per step becomes `[..., 1]` as in
    TorchRL (`sample_log_prob` excepted), and the algorithm fields `advantage` and `return`
    become `"advantage"` and `"value_target"`. Fields of neither kind are left out.

    Examples:
        >>> rollout = allocate_rollout(num_envs=2, rollout_len=3, obs_dim=4, action_dim=1)
        >>> out = torchrl_transitions(rollout.reshape(-1))
        >>> out["observation"].shape, out["next", "reward"].shape, out["sample_log_prob"].shape
        (torch.Size([8, 4]), torch.Size([8, 1]), torch.Size([8]))
    """
    out = TensorDict(batch_size=transitions.batch_size, device=transitions.device)
    for field in FIELDS:
        entry = transitions.get(field.name, None)
        if entry is None:
            continue
        if field.feature is None and field.key != keys.SAMPLE_LOG_PROB:
            entry = entry.unsqueeze(-1)  # TorchRL's per-step numbers are [..., 1]
        out.set(field.key, entry)
    for name, key in ALGORITHM_KEYS.items():
        attached = transitions.get(name, None)
        if attached is not None:
            out.set(key, attached.unsqueeze(-1))
    return out


def as_torchrl(rollout: TensorDictBase) -> TensorDict:
    """The `[*B, T]` transitions of a buffer-layout rollout under TorchRL's keys (a new
    TensorDict sharing the rollout's memory where it can): `torchrl_transitions` of its first
    `T` steps, with what follows each step.

    `("next", "observation")` is `obs[t + 1]`: the observation after a step, except at the
    last step of an episode, whose final observation the buffer layout does not keep (that is
    what `final_value` stands in for); `("next", "state_value")` is `next_values(rollout)`.

    Raises:
        TypeError: `rollout` is not in the buffer layout.
    """
    if not is_buffer_layout(rollout):
        raise TypeError(
            "as_torchrl takes a rollout in the buffer layout (fields obs, action, value, ...); "
            f"got one with keys {sorted(map(str, rollout.keys()))}."
        )
    steps, dim = rollout.batch_size[-1] - 1, rollout.batch_dims - 1
    out = torchrl_transitions(rollout[..., :steps])
    out.set((keys.NEXT, keys.OBSERVATION), rollout.get(OBS).narrow(dim, 1, steps))
    out.set((keys.NEXT, keys.STATE_VALUE), next_values(rollout).unsqueeze(-1))
    out.names = [*([None] * dim), keys.TIME_DIM_NAME]
    return out

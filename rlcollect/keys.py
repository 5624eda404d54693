"""The key names of the batch contract (DESIGN.md), in one place."""

from __future__ import annotations

import numbers

OBSERVATION = "observation"
ACTION = "action"
REWARD = "reward"
DONE = "done"
TERMINATED = "terminated"
TRUNCATED = "truncated"
NEXT = "next"
RESET = "_reset"

COLLECTOR = "collector"
TRAJ_IDS = (COLLECTOR, "traj_ids")
MASK = (COLLECTOR, "mask")
WORKER_ID = (COLLECTOR, "worker_id")

STEP_COUNT = "step_count"
EPISODE_REWARD = "episode_reward"
IS_INIT = "is_init"
POLICY_VERSION = "policy_version"

SAMPLE_LOG_PROB = "sample_log_prob"
STATE_VALUE = "state_value"
ADVANTAGE = "advantage"
VALUE_TARGET = "value_target"
PRIORITY_WEIGHT = "priority_weight"
INDEX = "index"

DONE_KEYS = (DONE, TERMINATED, TRUNCATED)
TIME_DIM_NAME = "time"

# The compact layout (rlcollect/batch/compact.py): next observations stored apart, and their steps.
FINAL = "final"
FINAL_STEP = (FINAL, "step")


# --- nested-key helpers: one spelling of a key, its last name, its sibling ---

NestedName = str | tuple[str, ...]


def plain_key(key: NestedName) -> NestedName:
    """`("done",)` -> `"done"`: root keys as strings, nested ones as tuples (TorchRL's way), so
    that two spellings of one key compare equal."""
    return key[0] if isinstance(key, tuple) and len(key) == 1 else key


def as_tuple_key(key: NestedName) -> tuple[str, ...]:
    """`"done"` -> `("done",)`: every key as a tuple of names."""
    return (key,) if isinstance(key, str) else tuple(key)


def last_name(key: NestedName) -> str:
    """The leaf name of `key`: `("agents", "reward")` -> `"reward"`."""
    return key if isinstance(key, str) else key[-1]


def sibling_key(key: NestedName, name: str) -> NestedName:
    """The key next to `key` in its group: `("agents", "truncated")` -> `("agents", name)`."""
    return name if isinstance(key, str) else (*key[:-1], name)


def is_int(value: object) -> bool:
    """Whether `value` is an integer (NumPy and other integral types too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)

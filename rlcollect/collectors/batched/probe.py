"""The slots' layout, learned from one env's reset and one policy pass (as TorchRL's "auto"
transport derives its request and response specs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase, set_interaction_type

from rlcollect.collectors.policy.resolve import (
    lend_exploration_spec,
    policy_outputs,
    resolve_policy,
)
from rlcollect.keys import NestedName

Entry = tuple[NestedName, tuple[int, ...], torch.dtype]


@dataclass(frozen=True)
class Probe:
    """What the slots hold: the request entries (what the policy reads), the response
    entries (what it writes) and the env's observation keys."""

    requests: list[Entry]
    responses: list[Entry]
    observation_keys: list[NestedName]
    policy: Any  # the policy as the server calls it
    env_batch_size: tuple[int, ...] = ()  # one env per maker has ()


def served_policy(policy: Any, observation_keys: list[NestedName]) -> Any:
    """`policy` as the server calls it: a TensorDict module (a plain module is wrapped to read
    the observation keys its forward names and write `"action"`, as every collector does)."""
    return resolve_policy(policy, observation_keys)


def build_served_policy(factory: Callable[[], Any], observation_keys: list[NestedName]) -> Any:
    """A factory's policy, wrapped as `served_policy` wraps one (run where it is served)."""
    return served_policy(factory(), observation_keys)


def probe_layout(env_maker: Callable[[], Any], policy: Any, exploration_type: Any) -> Probe:
    """Reset one env made by `env_maker`, run `policy` (as `served_policy` makes it) on its
    observation, and read the entries off both.

    Raises:
        ValueError: the policy reads a key the env does not give, or writes no action.
    """
    env = env_maker()
    try:
        root = env.reset()
        observation_keys = [
            key for key in env.observation_spec.keys(True, True) if key in root.keys(True, True)
        ]
        batch_dims = len(env.batch_size)
        lend_exploration_spec(policy, env)
        policy = served_policy(policy, observation_keys)
        wanted = _request_keys(policy, observation_keys)
        missing = [key for key in wanted if key not in root.keys(True, True)]
        if missing:
            raise ValueError(
                f"the policy reads {missing}, which the env's reset does not give (it gives "
                f"{sorted(map(str, root.keys(True, True)))}); set the policy's in_keys to "
                "observation keys."
            )
        requests = [_entry(root, key, batch_dims) for key in wanted]
        rows = root.select(*wanted).reshape(-1)[:1] if batch_dims else root.select(*wanted)
        rows = rows.unsqueeze(0) if not batch_dims else rows
        with set_interaction_type(exploration_type):
            outputs = policy_outputs(policy, rows.clone())
        responses = [_entry(outputs, key, 1) for key in outputs.keys(True, True)]
        return Probe(requests, responses, observation_keys, policy, tuple(env.batch_size))
    finally:
        env.close()


def _request_keys(policy: Any, observation_keys: list[NestedName]) -> list[NestedName]:
    """What the policy reads: its `in_keys` (a TensorDict module), else every observation."""
    if isinstance(policy, TensorDictModuleBase) and getattr(policy, "in_keys", None):
        return list(policy.in_keys)
    return list(observation_keys)


def _entry(table: TensorDictBase, key: NestedName, batch_dims: int) -> Entry:
    value = table.get(key)
    return key, tuple(value.shape[batch_dims:]), value.dtype

"""`check_env`: run an env through the rlcollect / TorchRL env contract, one clause at a time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.envs.base import EnvBase
from rlcollect.envs.carrier import allocate_carrier
from rlcollect.envs.specs import Composite, TensorSpec
from rlcollect.errors import EnvContractError
from rlcollect.testing.assertions import (
    Key,
    check_entries,
    check_value,
    key_name,
    tensors_equal,
)
from rlcollect.testing.check_runs import (
    check_done_flags,
    check_seeded_runs,
    env_leaves,
    reward_leaves,
)

RESERVED_NAMES = {keys.ACTION, keys.REWARD, keys.NEXT, keys.RESET, *keys.DONE_KEYS}


def check_env(env: EnvBase, *, seed: int = 0, steps: int = 50) -> None:
    """Run `env` through its contract and raise `EnvContractError` on the first violation.

    The clauses, in order: the specs (observation and done specs are Composites; done,
    terminated and truncated are bool; leaf shapes start with the env batch size); `reset()`
    and `step()` outputs (keys, shapes = batch + feature, dtypes, device, domain via
    `spec.is_in`, the `"next"` layout, `done == terminated | truncated`, fresh tensors rather
    than views of the env's buffers); partial resets of batched envs through `"_reset"` and
    through `reset_into(t, mask)` (only the selected sub-envs change); and, from `set_seed(seed)`
    with the same actions: reproducible runs, `step_and_maybe_reset` (the root after a done
    step is reset with cleared flags, the other sub-envs carry their next observation),
    `rollout()` (batch `[*batch_size, steps]`, last dim named "time", the same values), and the
    buffer face (`reset_into` / `step_and_advance_into`, fused and unfused, into a carrier from
    `allocate_carrier(env.full_spec, steps)`) writing exactly what the TensorDict face returns.

    The env must support `set_seed`; a deterministic env may implement `_set_seed` as
    `return seed + self.batch_size.numel()`. The env is left open, bound to a private carrier.

    Args:
        env: the env to check (any `EnvBase`, TensorDict-first or buffer-first).

    Keyword Args:
        seed: the seed of the compared runs (actions are drawn from the action spec with it).
        steps: the number of steps of each run; make it long enough to cross episode ends.

    Raises:
        EnvContractError: the first clause the env breaks, naming the key at fault.
        TypeError: `env` is not an `EnvBase`.
        ValueError: `steps` is below 2.

    Examples:
        >>> from rlcollect.testing import CountingEnv
        >>> check_env(CountingEnv(episode_length=3, batch_size=(2,)), steps=8)
    """
    if not isinstance(env, EnvBase):
        raise TypeError(
            f"check_env checks rlcollect envs; got a {type(env).__name__}. Subclass "
            "rlcollect.envs.EnvBase (implementing `_reset` / `_step`) to check your env."
        )
    if steps < 2:
        raise ValueError(f"steps must be >= 2 to cover consecutive steps; got steps={steps}.")
    check_specs(env)
    root = check_reset(env)
    check_step(env, root)
    if env.batch_size.numel() > 1:
        check_partial_reset(env)
        check_partial_reset_into(env)
    check_seeded_runs(env, seed, steps)


def check_specs(env: EnvBase) -> None:
    """The specs exist, have the right types, flag dtypes and leading batch dims."""
    for name, kind in (
        ("observation_spec", Composite),
        ("done_spec", Composite),
        ("action_spec", TensorSpec),
        ("reward_spec", TensorSpec),
    ):
        spec = getattr(env, name, None)
        if not isinstance(spec, kind):
            raise EnvContractError(
                f"env.{name} must be a {kind.__name__}; got {spec!r}. Set it in the env's __init__."
            )
    if not env.observation_spec.leaves():
        raise EnvContractError("env.observation_spec has no leaf spec; declare the observations.")
    clash = RESERVED_NAMES & set(env.observation_spec.keys())
    if clash:
        raise EnvContractError(
            f"observation keys {sorted(clash)} clash with the keys of the batch contract; "
            "rename them."
        )
    for name in keys.DONE_KEYS:
        if name not in env.done_spec or env.done_spec[name].dtype != torch.bool:
            raise EnvContractError(
                f"env.done_spec must hold {name!r} with dtype torch.bool; got {env.done_spec!r}."
            )
    check_batch_dims(env)


def check_batch_dims(env: EnvBase) -> None:
    """Every leaf spec's shape starts with the env batch size."""
    for key, spec in env.full_spec.leaves():
        if spec.shape[: len(env.batch_size)] != env.batch_size:
            raise EnvContractError(
                f"the spec of key {key_name(key)} has shape {tuple(spec.shape)}, which does not "
                f"start with the env batch size {tuple(env.batch_size)}; leaf specs hold the "
                "batch dims first (use spec.expand(*batch_size))."
            )


def check_reset(env: EnvBase) -> TensorDictBase:
    """`reset()` returns the observations and cleared flags, in spec."""
    root = env.reset()
    observations, flags = env_leaves(env)
    check_entries("reset()", root, observations + flags, env.batch_size, env.device)
    for name in env.done_keys:
        if bool(root.get(name).any()):
            raise EnvContractError(
                f"reset(): flag {name!r} is set; every flag of a fresh episode must be False."
            )
    return root


def check_step(env: EnvBase, root: TensorDictBase) -> None:
    """`rand_action` and `step` conform, and `step` returns fresh tensors."""
    observations, flags = env_leaves(env)
    snapshot = root.clone()
    request = env.rand_action(root.clone())
    for key in env.action_keys:
        spec = env.full_action_spec[key]
        check_value("rand_action()", key, request.get(key, None), spec, env.device)
    action = request.select(*env.action_keys).clone()
    result = env.step(request)
    if not isinstance(result, TensorDictBase) or keys.NEXT not in result:
        raise EnvContractError(
            "step(): must return the input TensorDict with a 'next' sub-TensorDict; got "
            f"{type(result).__name__} with keys {list(getattr(result, 'keys', list)())}."
        )
    next_leaves = [((keys.NEXT, *key), spec) for key, spec in observations + flags]
    next_leaves += reward_leaves(env)
    check_entries("step()", result, next_leaves, env.batch_size, env.device)
    check_done_flags("step()", result.get(keys.NEXT))
    for key in env.action_keys:
        if not bool(tensors_equal(action.get(key), result.get(key)).all()):
            raise EnvContractError(f"step(): changed the {key!r} of the TensorDict it was given.")
    stepped = result.clone()
    _, follow_up = env.step_and_maybe_reset(env.rand_action(env.reset()))
    env.step_and_maybe_reset(env.rand_action(follow_up))
    check_unchanged("reset()", snapshot, root)
    check_unchanged("step()", stepped, result)


def check_unchanged(where: str, snapshot: TensorDictBase, current: TensorDictBase) -> None:
    """What the env returned earlier must not change when the env steps again."""
    for key in snapshot.keys(include_nested=True, leaves_only=True):
        if not bool(tensors_equal(snapshot.get(key), current.get(key)).all()):
            raise EnvContractError(
                f"{where}: the value of key {key_name(key)} it returned changed when the env "
                "stepped again; return fresh tensors (clone), not views of the env's buffers."
            )


def first_sub_env_mask(env: EnvBase) -> torch.Tensor:
    """A `batch_size` bool mask selecting only the first sub-env."""
    mask = torch.zeros(env.batch_size, dtype=torch.bool, device=env.device)
    mask.view(-1)[0] = True
    return mask


def check_partial_reset(env: EnvBase) -> None:
    """`reset(td)` with `"_reset"` changes only the selected sub-envs (TensorDict face)."""
    observations, flags = env_leaves(env)
    root = env.reset()
    for _ in range(2):
        _, root = env.step_and_maybe_reset(env.rand_action(root))
    for mask in (first_sub_env_mask(env), torch.zeros_like(first_sub_env_mask(env))):
        request = root.clone()
        request.set(keys.RESET, mask.reshape(*env.batch_size, 1))
        where = f"reset() with '_reset' = {mask.tolist()}"
        result = env.reset(request)
        check_entries(where, result, observations + flags, env.batch_size, env.device)
        check_kept_sub_envs(where, root, result, [key for key, _ in observations + flags], ~mask)
        check_flags_cleared(where, result, env.done_keys, mask)
        root = result
    step = env.step(env.rand_action(root))
    next_leaves = [((keys.NEXT, *key), spec) for key, spec in observations + flags]
    check_entries("step() after a partial reset", step, next_leaves, env.batch_size, env.device)


def check_kept_sub_envs(
    where: str,
    before: TensorDictBase,
    after: TensorDictBase,
    leaf_keys: list[Key],
    kept: torch.Tensor,
) -> None:
    """The sub-envs selected by `kept` hold the same values before and after."""
    for key in leaf_keys:
        if not bool(tensors_equal(before.get(key)[kept], after.get(key)[kept]).all()):
            raise EnvContractError(
                f"{where}: key {key_name(key)} changed for sub-envs that were not asked to "
                "reset; only the sub-envs where '_reset' is True may change."
            )


def check_flags_cleared(
    where: str, root: TensorDictBase, done_keys: Sequence[Any], mask: torch.Tensor
) -> None:
    """The flags of the reset sub-envs are all False."""
    for name in done_keys:
        if bool(root.get(name)[mask].any()):
            raise EnvContractError(f"{where}: flag {name!r} is still set for a reset sub-env.")


def check_partial_reset_into(env: EnvBase) -> None:
    """`reset_into(t, mask)` writes only the selected sub-envs' root at `t` (buffer face)."""
    observations, flags = env_leaves(env)
    carrier = allocate_carrier(env.full_spec, steps=2, device=env.device)
    env.bind(carrier)
    env.reset_into(0)
    carrier[(Ellipsis, 0)].update_(env.rand_action().select(*env.action_keys))
    env.step_and_advance_into(0)
    before = carrier.clone()
    mask = first_sub_env_mask(env)
    where = f"reset_into(1, mask={mask.tolist()})"
    env.reset_into(1, mask)
    root_keys = [key for key, _ in observations + flags]
    check_kept_sub_envs(where, before[..., 1], carrier[..., 1], root_keys, ~mask)
    check_kept_sub_envs(where, before[..., 0], carrier[..., 0], root_keys, torch.ones_like(mask))
    check_flags_cleared(where, carrier[..., 1], env.done_keys, mask)
    check_entries(where, carrier[..., 1], observations + flags, env.batch_size, env.device)

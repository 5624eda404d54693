"""The seeded-run clauses of `check_env`: reproducible runs, rollout, and the buffer face."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.envs.base import EnvBase
from rlcollect.envs.carrier import allocate_carrier
from rlcollect.envs.specs import TensorSpec, spec_leaves
from rlcollect.errors import EnvContractError
from rlcollect.testing.assertions import (
    Key,
    assert_same_keys,
    assert_same_values,
    check_entries,
    key_name,
    tensors_equal,
)

Leaves = list[tuple[Key, TensorSpec]]


def env_leaves(env: EnvBase) -> tuple[Leaves, Leaves]:
    """`(observation leaves, flag leaves)` of the env, keys as tuples."""
    observations: Leaves = list(env.observation_spec.leaves())
    flags: Leaves = list(spec_leaves(env.done_spec))
    return observations, flags


def reward_leaves(env: EnvBase) -> list[tuple[tuple[str, ...], TensorSpec]]:
    """`(("next", reward key), spec)` for each of the env's rewards."""
    if list(env.reward_keys) == [keys.REWARD]:
        return [((keys.NEXT, keys.REWARD), env.reward_spec)]
    return [((keys.NEXT, *key), spec) for key, spec in spec_leaves(env.reward_spec)]


def check_done_flags(where: str, next_td: TensorDictBase) -> None:
    """`done == terminated | truncated`, element-wise."""
    done = next_td.get(keys.DONE)
    expected = next_td.get(keys.TERMINATED) | next_td.get(keys.TRUNCATED)
    if not bool((done == expected).all()):
        raise EnvContractError(
            f"{where}: ('next', 'done') must equal terminated | truncated; got done="
            f"{done.tolist()}, terminated={next_td.get(keys.TERMINATED).tolist()}, "
            f"truncated={next_td.get(keys.TRUNCATED).tolist()}."
        )


@dataclass
class Trajectory:
    """A TensorDict-face run: the steps `[*B, T]` and the roots `[*B, T + 1]` around them."""

    steps: TensorDictBase
    roots: TensorDictBase


class ReplayPolicy:
    """A rollout policy writing a fixed sequence of actions, one per call."""

    def __init__(self, actions: list[TensorDictBase]) -> None:
        self.actions = iter(actions)

    def __call__(self, tensordict: TensorDictBase) -> TensorDictBase:
        tensordict.update(next(self.actions).clone())
        return tensordict


def check_seeded_runs(env: EnvBase, seed: int, steps: int) -> None:
    """Runs from `set_seed(seed)` with the same actions agree across faces and repetitions."""
    devices = [env.device] if env.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        actions = [env.rand_action().select(*env.action_keys) for _ in range(steps)]
    first = record_td_face(env, seed, actions)
    second = record_td_face(env, seed, actions)
    where = f"two runs from set_seed({seed}) with the same actions"
    compare_trajectories(where, env, first, second.steps, second.roots)
    check_rollout(env, seed, actions, first)
    for fused in (True, False):
        check_buffer_face(env, seed, actions, first, fused)


def seed_env(env: EnvBase, seed: int) -> None:
    """`env.set_seed(seed)`, which must exist and return an int."""
    try:
        result = env.set_seed(seed)
    except NotImplementedError as err:
        raise EnvContractError(
            f"set_seed({seed}) is not implemented; check_env compares seeded runs. Implement "
            "`_set_seed(seed) -> int` (a deterministic env returns seed + batch_size.numel())."
        ) from err
    if not isinstance(result, int):
        raise EnvContractError(
            f"set_seed({seed}) returned {result!r}; it must return the next unused seed (int)."
        )


def record_td_face(env: EnvBase, seed: int, actions: list[TensorDictBase]) -> Trajectory:
    """Seed, reset, and step with `actions` through `step_and_maybe_reset`, checking each step."""
    observations, flags = env_leaves(env)
    root_keys = [key for key, _ in observations + flags]
    step_leaves = [((keys.NEXT, *key), spec) for key, spec in observations + flags]
    step_leaves += reward_leaves(env)
    seed_env(env, seed)
    root = env.reset()
    roots, steps = [root.select(*root_keys).clone()], []
    for t, action in enumerate(actions):
        root.update(action.clone())
        where = f"step_and_maybe_reset() at step {t}"
        step, root = env.step_and_maybe_reset(root)
        check_entries(where, step, step_leaves, env.batch_size, env.device)
        check_done_flags(where, step.get(keys.NEXT))
        returned = f"{where}, the root it returned"
        check_entries(returned, root, observations + flags, env.batch_size, env.device)
        check_next_root(where, env, step, root)
        steps.append(step)
        roots.append(root.select(*root_keys).clone())
    time_dim = len(env.batch_size)
    return Trajectory(torch.stack(steps, time_dim), torch.stack(roots, time_dim))


def check_next_root(where: str, env: EnvBase, step: TensorDictBase, root: TensorDictBase) -> None:
    """The root after a step: reset (flags cleared) where done, the next observation elsewhere."""
    done = step.get((keys.NEXT, keys.DONE)).reshape(env.batch_size)
    for name in env.done_keys:
        if bool(root.get(name).any()):
            raise EnvContractError(
                f"{where}: the root it returned has flag {name!r} set; the sub-envs that are "
                "done must be reset, which clears their flags."
            )
    kept = ~done
    for key in env.observation_keys:
        carried = tensors_equal(step.get((keys.NEXT, *key))[kept], root.get(key)[kept])
        if not bool(carried.all()):
            raise EnvContractError(
                f"{where}: the root's {key_name(key)} of the sub-envs that are not done must "
                f"equal ('next', {key_name(key)}) of the step."
            )


def compare_trajectories(
    where: str,
    env: EnvBase,
    expected: Trajectory,
    steps: TensorDictBase,
    roots: TensorDictBase | None = None,
) -> None:
    """The same keys and values as `expected`, naming the first time step that differs."""
    time_dim = len(env.batch_size)
    step_keys = list(expected.steps.keys(include_nested=True, leaves_only=True))
    assert_same_keys(where, step_keys, steps.keys(include_nested=True, leaves_only=True))
    assert_same_values(where, expected.steps, steps, step_keys, time_dim)
    if roots is not None:
        root_keys = list(expected.roots.keys(include_nested=True, leaves_only=True))
        assert_same_values(f"{where}, roots", expected.roots, roots, root_keys, time_dim)


def check_rollout(
    env: EnvBase, seed: int, actions: list[TensorDictBase], expected: Trajectory
) -> None:
    """`rollout()` stacks along a last dim named "time" and matches `step_and_maybe_reset`."""
    count = len(actions)
    seed_env(env, seed)
    data = env.rollout(count, ReplayPolicy(actions), break_when_any_done=False)
    expected_batch = torch.Size([*env.batch_size, count])
    if not isinstance(data, TensorDictBase) or data.batch_size != expected_batch:
        raise EnvContractError(
            f"rollout({count}) returned {type(data).__name__} of batch size "
            f"{tuple(getattr(data, 'batch_size', ()))}; expected {tuple(expected_batch)}."
        )
    if data.names[-1] != keys.TIME_DIM_NAME:
        raise EnvContractError(
            f"rollout({count}): the last batch dim must be named 'time'; got names {data.names}."
        )
    compare_trajectories("rollout() vs step_and_maybe_reset()", env, expected, data)
    seed_env(env, seed)
    data = env.rollout(count, ReplayPolicy(actions), break_when_any_done=True)
    length = data.batch_size[-1]
    done = data.get((keys.NEXT, keys.DONE))
    ends = done.reshape(*env.batch_size, length, -1).movedim(-2, 0).reshape(length, -1).any(-1)
    if bool(ends[:-1].any()) or (length < count and not bool(ends[-1])):
        raise EnvContractError(
            f"rollout({count}, break_when_any_done=True) ran {length} steps with done at "
            f"steps {ends.nonzero().flatten().tolist()}; it must stop right after the first done."
        )
    prefix = Trajectory(expected.steps[..., :length], expected.roots[..., : length + 1])
    compare_trajectories("rollout(break_when_any_done=True)", env, prefix, data)


def check_buffer_face(
    env: EnvBase, seed: int, actions: list[TensorDictBase], expected: Trajectory, fused: bool
) -> None:
    """The buffer face writes into a carrier exactly what the TensorDict face returned."""
    count = len(actions)
    carrier = allocate_carrier(env.full_spec, steps=count, device=env.device)
    seed_env(env, seed)
    env.bind(carrier)
    env.reset_into(0)
    for t, action in enumerate(actions):
        carrier[(Ellipsis, t)].update_(action)
        if fused:
            env.step_and_advance_into(t)
        else:
            env.step_into(t)
            env.advance_into(t)
    face = "step_and_advance_into" if fused else "step_into + advance_into"
    where = f"buffer face (reset_into, {face}) vs TensorDict face"
    steps = carrier[(Ellipsis, slice(0, count))]
    root_keys = list(expected.roots.keys(include_nested=True, leaves_only=True))
    compare_trajectories(where, env, expected, steps, carrier.select(*root_keys))

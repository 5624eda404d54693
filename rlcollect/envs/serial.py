"""`SerialEnv`: several envs stepped one after the other in this process, as one batched env."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import torch
from tensordict import TensorDictBase

from rlcollect.envs.base import EnvBase
from rlcollect.envs.factory import make_env
from rlcollect.envs.gym import GymEnv
from rlcollect.envs.gym_batch import GymBatch
from rlcollect.envs.specs import batch_spec
from rlcollect.envs.torchrl_env import is_torchrl_env
from rlcollect.runtime.fan_out import per_child

EnvFactory = Callable[[], EnvBase]
CreateEnvFn = str | Callable[..., Any] | Sequence[Callable[..., Any]]
CreateEnvKwargs = Mapping[str, Any] | Sequence[Mapping[str, Any]] | None


def env_factories(
    num_workers: int, create_env_fn: CreateEnvFn, create_env_kwargs: CreateEnvKwargs = None
) -> list[EnvFactory]:
    """One zero-argument factory per worker, from the arguments batched envs accept.

    Args:
        num_workers: the number of sub-envs (>= 1).
        create_env_fn: a callable returning an env (an rlcollect or TorchRL env, or a
            `gymnasium.Env`, wrapped in `GymEnv`), a Gymnasium id string (made into a `GymEnv`),
            or a list of those (one per worker).
        create_env_kwargs: keyword arguments for `create_env_fn`: one mapping for all workers
            or a list of mappings (one per worker).

    Raises:
        ValueError: `num_workers` < 1, or a list whose length is not `num_workers`.
        TypeError: `create_env_fn` or `create_env_kwargs` of the wrong type.
    """
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(
            f"num_workers must be a positive int; got num_workers={num_workers!r}. "
            "Pass the number of sub-envs to batch, e.g. num_workers=4."
        )
    functions = per_child("create_env_fn", create_env_fn, num_workers)
    kwargs_list = per_child("create_env_kwargs", create_env_kwargs or {}, num_workers)
    factories: list[EnvFactory] = []
    for index, (function, kwargs) in enumerate(zip(functions, kwargs_list, strict=True)):
        if not isinstance(kwargs, Mapping):
            raise TypeError(
                f"create_env_kwargs must be a mapping or a list of mappings; got "
                f"{type(kwargs).__name__} for worker {index}."
            )
        if isinstance(function, str):
            check_gym_id(function)
            factories.append(functools.partial(GymEnv, function, **kwargs))
        elif callable(function):
            factories.append(functools.partial(build_env, function, dict(kwargs)))
        else:
            raise TypeError(
                f"create_env_fn must be a callable returning an env, a list of them, or a "
                f"Gymnasium id string; got {type(function).__name__} for worker {index}."
            )
    return factories


def check_gym_id(env_id: str) -> None:
    """Raise a ValueError naming `create_env_fn` when `env_id` is not a registered Gymnasium id."""
    name = env_id
    try:
        if ":" in env_id:
            module, name = env_id.split(":", 1)
            importlib.import_module(module)
        gym.spec(name)
    except (gym.error.Error, ImportError) as err:
        raise ValueError(
            f"create_env_fn={env_id!r} is not a registered Gymnasium id ({err}); check the "
            "spelling and version suffix (e.g. 'CartPole-v1'), or import the package that "
            "registers it."
        ) from err


def build_env(function: Callable[..., Any], kwargs: Mapping[str, Any]) -> EnvBase:
    """Call `function(**kwargs)`: a `gymnasium.Env` is wrapped in `GymEnv`, a TorchRL env in
    `TorchRLEnv`; anything else but an rlcollect env is a TypeError."""
    env = function(**kwargs)
    if isinstance(env, gym.Env):
        return GymEnv(env)
    if isinstance(env, EnvBase) or is_torchrl_env(env):
        return make_env(env)
    raise TypeError(
        f"create_env_fn must return an rlcollect env, a TorchRL env or a gymnasium.Env; "
        f"{function!r} returned {type(env).__name__}."
    )


def check_same_specs(envs: Sequence[EnvBase]) -> None:
    """Raise a ValueError naming the first sub-env, and key, whose specs differ from sub-env 0's."""
    reference = envs[0]
    reference_leaves = dict(reference.full_spec.leaves())
    for index, env in enumerate(envs[1:], start=1):
        if env.batch_size != reference.batch_size:
            raise ValueError(
                f"sub-env {index} has batch {tuple(env.batch_size)} but sub-env 0 has "
                f"{tuple(reference.batch_size)}; all sub-envs of a batched env must match."
            )
        leaves = dict(env.full_spec.leaves())
        for key in [*reference_leaves, *(key for key in leaves if key not in reference_leaves)]:
            if leaves.get(key) != reference_leaves.get(key):
                raise ValueError(
                    f"sub-env {index} has specs that differ from sub-env 0's at key {key}: "
                    f"{leaves.get(key)!r} vs {reference_leaves.get(key)!r}; all sub-envs of a "
                    "batched env must have the same specs (shapes, dtypes and domains)."
                )


class SerialEnv(EnvBase):
    """Runs `num_workers` envs one after the other in this process, as one env of batch
    `[num_workers, *sub_batch]`.

    Buffer-first: binding a carrier binds sub-env i to the view `carrier[i]`, so each sub-env
    writes its own rows in place and stepping costs one call per sub-env. When every sub-env
    is a plain `GymEnv`, a step is one call for the batch instead (`GymBatch`): the Gymnasium
    envs are stepped in a loop and their results stored with one NumPy store per key. Specs
    are the sub-env specs with the batch dim prepended.

    Args:
        num_workers: the number of sub-envs.
        create_env_fn: a callable returning an env (an rlcollect or TorchRL env, or a
            `gymnasium.Env`), a Gymnasium id string, or a list of those (one per worker).
        create_env_kwargs: keyword arguments for `create_env_fn`, one mapping or one per worker.

    Examples:
        >>> env = SerialEnv(3, "CartPole-v1")
        >>> env.set_seed(0)
        3
        >>> data = env.rollout(4, break_when_any_done=False)
        >>> data.batch_size, data.names
        (torch.Size([3, 4]), [None, 'time'])
        >>> env.close()
    """

    def __init__(
        self,
        num_workers: int,
        create_env_fn: CreateEnvFn,
        create_env_kwargs: CreateEnvKwargs = None,
    ) -> None:
        factories = env_factories(num_workers, create_env_fn, create_env_kwargs)
        self.num_workers = num_workers
        self.envs: list[EnvBase] = []
        try:
            for factory in factories:
                self.envs.append(factory())
            check_same_specs(self.envs)
        except BaseException:
            self._close_envs()
            raise
        first = self.envs[0]
        super().__init__(batch_size=(num_workers, *first.batch_size), device=first.device)
        self.observation_spec = batch_spec(first.observation_spec, num_workers)
        self.action_spec = batch_spec(first.action_spec, num_workers)
        self.reward_spec = batch_spec(first.reward_spec, num_workers)
        self.done_spec = batch_spec(first.done_spec, num_workers)
        self._fused_steps = [env.step_and_advance_into for env in self.envs]
        # Plain Gymnasium sub-envs are stepped together, with one store per key and step.
        self._gym_batch = GymBatch.of(self.envs)
        self._step_and_advance = (
            self._step_each if self._gym_batch is None else self._gym_batch.step_and_advance_into
        )

    @property
    def action_keys(self) -> list[Any]:
        return list(self.envs[0].action_keys)

    @property
    def reward_keys(self) -> list[Any]:
        return list(self.envs[0].reward_keys)

    @property
    def group_map(self) -> dict[str, list[str]]:
        return self.envs[0].group_map

    @property
    def agents_per_step(self) -> int:
        return self.envs[0].agents_per_step

    @property
    def full_action_spec(self) -> Any:
        return batch_spec(self.envs[0].full_action_spec, self.num_workers)

    def fake_tensordict(self) -> TensorDictBase:
        """The sub-envs' frames, stacked (nested keys kept as the sub-envs lay them out)."""
        return torch.stack([env.fake_tensordict() for env in self.envs], 0)

    # --- buffer face --------------------------------------------------------------------------

    def _bind(self, carrier: TensorDictBase) -> None:
        for index, env in enumerate(self.envs):
            env.bind(carrier[index])
        if self._gym_batch is not None:
            self._gym_batch.bind(carrier)

    def reset_into(self, t: int, mask: torch.Tensor | None = None) -> None:
        self._check_open()
        if mask is None:
            for env in self.envs:
                env.reset_into(t)
            return
        per_env = mask.reshape(self.num_workers, -1)
        selected = per_env.any(dim=1).tolist()
        complete = per_env.all(dim=1).tolist()
        sub_batch = self.batch_size[1:]
        for index, env in enumerate(self.envs):
            if selected[index]:
                sub_mask = None if complete[index] else per_env[index].reshape(sub_batch)
                env.reset_into(t, sub_mask)

    def step_into(self, t: int) -> None:
        self._check_open()
        for env in self.envs:
            env.step_into(t)

    def advance_into(self, t: int) -> None:
        for env in self.envs:
            env.advance_into(t)

    def step_and_advance_into(self, t: int) -> None:
        self._check_open()
        self._step_and_advance(t)

    def _step_each(self, t: int) -> None:
        for step_and_advance_into in self._fused_steps:
            step_and_advance_into(t)

    # --- protocol -----------------------------------------------------------------------------

    def _set_seed(self, seed: int) -> int:
        for env in self.envs:
            seed = env.set_seed(seed)
        return seed

    def close(self) -> None:
        if not self.is_closed:
            self._close_envs()
        super().close()

    def _close_envs(self) -> None:
        for env in self.envs:
            env.close()

    def __repr__(self) -> str:
        return (
            f"SerialEnv(num_workers={self.num_workers}, batch_size={tuple(self.batch_size)}, "
            f"env={type(self.envs[0]).__name__})"
        )

"""`TorchRLEnv`: a TorchRL env seen through rlcollect's env protocol (TensorDict face first)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from rlcollect import keys
from rlcollect.envs.base import EnvBase
from rlcollect.envs.carrier import CarrierViews
from rlcollect.envs.step_stack import StepViews, is_step_stack


def is_torchrl_env(env: Any) -> bool:
    """Whether `env` is a TorchRL `EnvBase` instance (duck-typed: TorchRL stays optional).

    Only TorchRL's env classes count: its other objects (an `EnvCreator`, a transform) are
    not envs, and an `EnvCreator` is an env maker, called like any other."""
    return any(
        cls.__name__ == "EnvBase" and cls.__module__.startswith("torchrl.envs")
        for cls in type(env).__mro__
    )


class TorchRLEnv(EnvBase):
    """Wraps a TorchRL env so that rlcollect collectors can drive it.

    The TorchRL env keeps its own specs; its buffer face is derived from its TensorDict face
    through carrier views, so it is slower than a native env but exact. An env whose entries
    cannot share one buffer (`fits_one_buffer` False: heterogeneous agents, dynamic specs)
    runs over a carrier stacked lazily over time, one TensorDict a step (`envs/step_stack.py`).

    Args:
        env: a `torchrl.envs.EnvBase` instance.
    """

    def __init__(self, env: Any) -> None:
        super().__init__(env.batch_size, env.device or "cpu")
        self.env = env
        self.observation_spec = env.observation_spec
        self.action_spec = env.action_spec
        self.reward_spec = env.reward_spec
        self.done_spec = env.output_spec["full_done_spec"]

    def __getattr__(self, name: str) -> Any:
        """What rlcollect's protocol lacks is the TorchRL env's (`full_observation_spec`,
        `transform`, ...), so `collector.env` reads as the TorchRL env a user handed over."""
        if name.startswith("_") or name == "env":  # not set yet (e.g. while unpickling)
            raise AttributeError(name)
        return getattr(self.env, name)

    @property
    def observation_keys(self) -> list[tuple[str, ...]]:
        found = self.env.observation_spec.keys(include_nested=True, leaves_only=True)
        return [key if isinstance(key, tuple) else (key,) for key in found]

    @property
    def ragged_keys(self) -> list[tuple[str, ...]]:
        """The entries that cannot share one buffer over the sub-envs and steps: lazily
        stacked (heterogeneous) specs, and specs with a dynamic (-1) dim."""
        env = self.env
        specs = (env.full_observation_spec, env.full_action_spec, env.full_done_spec)
        return [key for spec in (*specs, env.full_reward_spec) for key in _ragged_keys(spec)]

    @property
    def fits_one_buffer(self) -> bool:
        """Whether every entry has one shape over the sub-envs and steps, so that a batch
        is one preallocated buffer (else the collector stacks one TensorDict a step)."""
        return not self.ragged_keys

    def _carrier_views(self) -> CarrierViews | StepViews:  # type: ignore[override]
        if self._views is None and self._carrier is not None and is_step_stack(self._carrier):
            self._check_open()
            self._views = StepViews(self._carrier)  # type: ignore[assignment]
        return super()._carrier_views()

    @property
    def keeps_no_device(self) -> bool:
        """Whether the TorchRL env has no device (`None`): it is then handed TensorDicts
        without one, and its batches have none, as in TorchRL's collector."""
        return self.env.device is None

    @property
    def done_keys(self) -> list[Any]:
        return list(self.env.done_keys)

    @property
    def action_keys(self) -> list[Any]:
        return list(self.env.action_keys)

    @property
    def reward_keys(self) -> list[Any]:
        return list(self.env.reward_keys)

    @property
    def full_action_spec(self) -> Any:
        return self.env.full_action_spec

    @property
    def group_map(self) -> dict[str, list[str]]:
        """A TorchRL multi-agent env's group map (empty without one)."""
        group_map = getattr(self.env, "group_map", None)
        if not isinstance(group_map, Mapping):
            return {}
        return {group: list(agents) for group, agents in group_map.items()}

    @property
    def agents_per_step(self) -> int:
        """The agents of a TorchRL multi-agent env's group map (1 without one)."""
        group_map = getattr(self.env, "group_map", None)
        return sum(len(agents) for agents in group_map.values()) if group_map else 1

    def fake_tensordict(self) -> TensorDictBase:
        return self.env.fake_tensordict()

    def _bind(self, carrier: TensorDictBase) -> None:
        # The `"next"` entries handed to TorchRL as its preset: what a policy writes there (a
        # recurrent state, TorchRL envs' "state" keys included), never what the env itself
        # outputs. The carrier still holds an earlier step's outputs, and TorchRL transforms
        # read a preset they find (StepCounter ORs a preset "truncated" into its own).
        env = self.env
        state = _tuple_keys(env.full_state_spec)
        produced = {
            *_tuple_keys(env.full_observation_spec),
            *_tuple_keys(env.full_done_spec),
            *_tuple_keys(env.full_reward_spec),
        } - state
        next_keys = _tuple_keys(carrier.get(keys.NEXT))
        self._preset_keys = [key for key in next_keys if key not in produced]
        # What moves from "next" to the next step's root, listed once per carrier (listing a
        # lazily stacked spec's keys costs milliseconds). A transform may leave a next
        # observation out of the batch (TorchRL's `NextObservationDelta` keeps a low-precision
        # delta instead, and its fake tensordict has no ("next", obs)): the step's full value
        # is then held aside for the next root, as TorchRL's step_mdp promotes it.
        observations = [keys.plain_key(key) for key in self.observation_keys]
        self._carried = [*observations, *self.done_keys]
        self._held_keys = [key for key in self.observation_keys if key not in next_keys]
        held = {keys.plain_key(key) for key in self._held_keys}
        self._moved = [key for key in self._carried if key not in held]
        self._held_next: TensorDictBase | None = None

    def reset_into(self, t: int, mask: torch.Tensor | None = None) -> None:
        """Reset with nothing but the reset flags, as TorchRL's collector does: the carrier's
        stale root (zeros at first) must not reach a TorchRL env as the state to reset to
        (envs with state keys, e.g. TorchRL's `PendulumEnv` and its `params`, honour it)."""
        views = self._carrier_views()
        if mask is None:
            result = self.env.reset()
        elif isinstance(views, StepViews):
            # TorchRL merges a partial reset into the state it is given: with lazily stacked
            # entries it needs the whole state (the root at t, which is not stale here).
            request = views.root_with_extras(t).update(self._reset_request(mask))
            result = self.env.reset(request)
        else:
            result = self.env.reset(self._reset_request(mask))
        views.write_root(t, result.exclude(keys.NEXT), mask)

    def advance_into(self, t: int) -> None:
        """Fill root `t + 1` as TorchRL's `step_and_maybe_reset` does: the next observations
        and flags move to the root, then TorchRL decides which groups of flags reset (a
        group's flags prevail over those nested under it) and merges the reset."""
        views = self._carrier_views()
        carried = self._carried
        views.move_to_root(t, self._moved)
        if self._held_next is not None:
            views.write_root(t + 1, self._held_next)
        flags = views.root(t + 1).select(*self.done_keys).clone()
        if not self.env.any_done(flags):  # writes the "_reset" flags it decided on
            return
        state = views.root_with_extras(t + 1).select(*carried)
        for key in self.env.reset_keys:
            if key in flags.keys(include_nested=True):
                state.set(key, flags.get(key))
        result = self.env.reset(state, select_reset_only=True)
        views.write_root(t + 1, result.exclude(keys.NEXT))

    def _reset_request(self, mask: torch.Tensor) -> TensorDictBase:
        """The reset flags for the sub-envs in `mask`: one `"_reset"` per group of done flags
        (`("data", "_reset")` for flags under `"data"`), shaped as that group's flags."""
        env = self.env
        request = TensorDict({}, batch_size=self.batch_size, device=env.device)
        batch = mask.reshape(self.batch_size)
        for reset_key, group in zip(env.reset_keys, env.done_keys_groups, strict=True):
            shape = env.full_done_spec[group[0]].shape
            flags = batch.reshape(*batch.shape, *([1] * (len(shape) - batch.ndim)))
            request.set(reset_key, flags.expand(shape).clone())
        return request

    def step_into(self, t: int) -> None:
        """Step with the root at `t`, and with what the policy already wrote under `"next"`
        (a recurrent state): TorchRL envs keep those entries, as in TorchRL's own collector."""
        views = self._carrier_views()
        request = views.root_with_extras(t)
        if self._preset_keys:
            request.set(keys.NEXT, views.next(t).select(*self._preset_keys).clone())
        result = self.env.step(request).get(keys.NEXT)
        if self._held_keys:
            self._held_next = result.select(*self._held_keys)
        views.write_next(t, result)

    def _reset(self, tensordict: TensorDictBase | None) -> TensorDictBase:
        result = self.env.reset(tensordict)
        return result.exclude(keys.NEXT)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self.env.step(tensordict).get(keys.NEXT)

    def _set_seed(self, seed: int) -> int:
        return int(self.env.set_seed(seed))

    def state_dict(self) -> dict[str, Any]:
        return self.env.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.env.load_state_dict(state)

    def close(self) -> None:
        if not self.is_closed:
            self.env.close()
        super().close()


def _ragged_keys(spec: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Where a TorchRL spec holds lazily stacked (heterogeneous) entries or a dynamic (-1)
    dim, at any depth."""
    if "Stacked" in type(spec).__name__:
        return [prefix]
    if hasattr(spec, "items"):
        return [key for name, child in spec.items() for key in _ragged_keys(child, (*prefix, name))]
    return [prefix] if -1 in tuple(spec.shape) else []


def _tuple_keys(container: Any) -> set[tuple[str, ...]]:
    """The leaf keys of a spec or TensorDict, as tuples."""
    found = container.keys(include_nested=True, leaves_only=True)
    return {key if isinstance(key, tuple) else (key,) for key in found}

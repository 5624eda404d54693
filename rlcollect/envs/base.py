"""`EnvBase`: the TorchRL-compatible env protocol, with its TensorDict face and its buffer face.

An env has two faces (DESIGN.md, "two faces"):

* the **TensorDict face** -- `reset(td)`, `step(td)`, `step_and_maybe_reset(td)`, `rollout()` --
  compatible with TorchRL's `EnvBase`;
* the **buffer face** used by collectors: `bind(carrier)` tells the env where to write, then
  `reset_into(t)`, `step_into(t)` and `advance_into(t)` write step results straight into the
  preallocated carrier at time index `t`, without building a TensorDict per step.

The carrier is a TensorDict of batch `[*env.batch_size, L + 1]` (time is the last batch dim)
holding the root keys (observations, `"action"`, flags) and a `"next"` sub-TensorDict (next
observations, `"reward"`, flags). Slot `t + 1` of the root receives the observation the policy
sees after step `t`, so `L + 1` slots hold `L` steps.

A subclass implements ONE face; the other is derived from it:

* buffer-first envs (GymEnv, SerialEnv, ParallelEnv) override `_bind`, `reset_into` and
  `step_into` (and may fuse `step_and_advance_into`); their TensorDict face runs through a
  private one-step carrier, so the two faces cannot drift;
* TensorDict-first envs (TorchRL-style subclasses, TransformedEnv) override `_reset(td)` and
  `_step(td)`; their buffer face reads and writes views of the carrier.

Multi-agent envs (`PettingZooEnv`, TorchRL's grouped envs) group their agents under group keys
with an agent dim, as TorchRL does: `("agents", "observation")` is `[*env_batch, n_agents,
*obs_shape]`, each group has its own `"action"`, `("next", group, "reward")` and per-agent
`"done"` / `"terminated"` / `"truncated"`, and the env-level flags at the root are derived from
the agents' (set when any agent's are). `group_map` names each group's agents in the order of
its agent dim; `action_keys`, `reward_keys` and `done_keys` list the nested keys, and
`agents_per_step` how many agents act at each step (what `count_steps_by="agent_steps"` counts).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDict, TensorDictBase

from rlcollect import keys
from rlcollect.envs.carrier import CarrierViews, allocate_carrier
from rlcollect.envs.rollout import run_rollout
from rlcollect.envs.specs import Composite, TensorSpec, spec_leaves
from rlcollect.errors import MisuseError

Policy = Callable[[TensorDictBase], TensorDictBase]
NestedKey = str | tuple[str, ...]


class EnvBase:
    """Base class of every rlcollect env; see the module docstring for the two faces.

    Contract of `step`: the input TensorDict carries the root keys of time t (observation keys,
    flags) and `"action"`; `step` writes the `"next"` sub-TensorDict (next observation keys,
    `"reward"`, `"done"`, `"terminated"`, `"truncated"`) and returns the same TensorDict. After a
    step with `done` set, the sub-env must be reset before it is stepped again
    (`step_and_maybe_reset` does it). `done == terminated | truncated` always.

    Subclasses set `batch_size`, `device`, `observation_spec`, `action_spec`, `reward_spec` and
    `done_spec` in `__init__` (leaf specs with the batch dims first, as TorchRL's). Its TensorDict
    face is `EnvProtocol` (`envs/protocol.py`), the contract TorchRL's envs meet too.
    """

    _abstract = True
    batch_size: torch.Size = torch.Size([])
    device: torch.device = torch.device("cpu")
    observation_spec: Composite
    action_spec: TensorSpec
    reward_spec: TensorSpec
    done_spec: Composite

    def __init__(self, batch_size: torch.Size | tuple = (), device: object = "cpu") -> None:
        self.batch_size = torch.Size(batch_size)
        self.device = torch.device(device)  # type: ignore[call-overload]
        self._carrier: TensorDictBase | None = None
        self._views: CarrierViews | None = None
        self._scratch: TensorDictBase | None = None
        self.is_closed = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        buffer_first = cls.step_into is not EnvBase.step_into
        dict_first = cls._step is not EnvBase._step
        if not (buffer_first or dict_first) and not cls.__dict__.get("_abstract", False):
            raise TypeError(
                f"{cls.__name__} must implement one face of EnvBase: either `_reset(td)` and "
                "`_step(td)` (TensorDict face) or `_bind`, `reset_into` and `step_into` "
                "(buffer face)."
            )

    # --- keys -------------------------------------------------------------------------------

    @property
    def observation_keys(self) -> list[tuple[str, ...]]:
        """Every observation leaf key, as tuples."""
        return [key for key, _ in spec_leaves(self.observation_spec)]

    @property
    def done_keys(self) -> list[NestedKey]:
        """The flag keys: `done`, `terminated`, `truncated` (nested keys for envs, such as
        TorchRL's, whose flags live under a sub-TensorDict or in several groups)."""
        return [keys.plain_key(key) for key, _ in spec_leaves(self.done_spec)]

    @property
    def action_keys(self) -> list[NestedKey]:
        """Where the env reads its action(s): `["action"]` for our envs."""
        return [keys.ACTION]

    @property
    def reward_keys(self) -> list[NestedKey]:
        """Where the env writes its reward(s) under `"next"`: `["reward"]` for our envs."""
        return [keys.REWARD]

    @property
    def agents_per_step(self) -> int:
        """How many agents act at each step of one sub-env (1: a single-agent env)."""
        return 1

    @property
    def group_map(self) -> dict[str, list[str]]:
        """A multi-agent env's groups: group key -> the ids of its agents, in the order of the
        group's agent dim (empty for a single-agent env)."""
        return {}

    @property
    def full_action_spec(self) -> Composite:
        """The action spec(s) under their keys, as one Composite."""
        spec = Composite(shape=self.batch_size, device=self.device)
        spec[keys.ACTION] = self.action_spec
        return spec

    @property
    def full_spec(self) -> Composite:
        """One Composite with the root keys and the `"next"` keys of a transition."""
        root = Composite(shape=self.batch_size, device=self.device)
        next_spec = Composite(shape=self.batch_size, device=self.device)
        for key, spec in spec_leaves(self.observation_spec):
            root[key] = spec
            next_spec[key] = spec
        for key, spec in spec_leaves(self.done_spec):
            root[key] = spec
            next_spec[key] = spec
        # Grouped envs (and batches of them) keep their actions and rewards under the groups.
        for key, spec in spec_leaves(self.full_action_spec):
            root[key] = spec
        if isinstance(self.reward_spec, Composite):
            for key, spec in spec_leaves(self.reward_spec):
                next_spec[key] = spec
        else:
            next_spec[keys.REWARD] = self.reward_spec
        root[keys.NEXT] = next_spec
        return root

    def fake_tensordict(self) -> TensorDictBase:
        """A zero-filled transition (root keys, `"action"` and `"next"`) of batch `batch_size`."""
        return self.full_spec.zero()

    # --- buffer face --------------------------------------------------------------------------

    def bind(self, carrier: TensorDictBase) -> None:
        """Make `carrier` (batch `[*batch_size, L + 1]`) the destination of the buffer face.

        Binding the carrier already bound is free, so collectors call it once per batch.
        """
        if carrier is self._carrier:
            return
        expected = self.batch_size
        if carrier.batch_size[:-1] != expected:
            raise ValueError(
                f"carrier batch {tuple(carrier.batch_size)} does not match the env batch "
                f"{tuple(expected)}; allocate it as [*env.batch_size, L + 1]."
            )
        self._check_open()
        self._carrier = carrier
        self._views = None
        self._bind(carrier)

    def _bind(self, carrier: TensorDictBase) -> None:
        """Hook for buffer-first envs: compute the views they write through."""

    def reset_into(self, t: int, mask: torch.Tensor | None = None) -> None:
        """Reset the sub-envs selected by `mask` (all when None), writing the root at `t`.

        The other sub-envs' root entries at `t` are left untouched.
        """
        views = self._carrier_views()
        root = views.root(t)
        request = root.select(*self.observation_keys, *self.done_keys).clone()
        if mask is not None:
            request.set(keys.RESET, mask.reshape((*self.batch_size, 1)).clone())
        result = self._reset(request)
        views.write_root(t, result, mask)

    def step_into(self, t: int) -> None:
        """Step every sub-env with the action at root `t`, writing `"next"` at `t`."""
        views = self._carrier_views()
        request = views.root(t).exclude(keys.NEXT).clone()
        result = self._step(request)
        views.write_next(t, result)

    def advance_into(self, t: int) -> None:
        """Fill root `t + 1` from `"next"` at `t`, resetting the sub-envs that are done."""
        views = self._carrier_views()
        views.carry_observations(t, self.observation_keys)
        done = views.next_done(t)
        if bool(done.any()):
            self.reset_into(t + 1, None if bool(done.all()) else done)

    def step_and_advance_into(self, t: int) -> None:
        """`step_into(t)` then `advance_into(t)`; buffer-first envs fuse the two."""
        self.step_into(t)
        self.advance_into(t)

    def _carrier_views(self) -> CarrierViews:
        self._check_open()
        if self._carrier is None:
            raise MisuseError(
                f"{type(self).__name__} has no carrier bound; call env.bind(carrier) before "
                "using the buffer face (collectors do this for you)."
            )
        if self._views is None:
            self._views = CarrierViews(self._carrier, self.done_keys)
        return self._views

    # --- TensorDict face ----------------------------------------------------------------------

    def reset(self, tensordict: TensorDictBase | None = None, **kwargs: object) -> TensorDictBase:
        """Reset and return the root TensorDict (observation keys and cleared flags).

        With `tensordict["_reset"]` (bool, shape `[*batch_size, 1]` or `batch_size`), only those
        sub-envs reset; the others keep the values they have in `tensordict`.
        """
        self._check_open()
        result = self._reset(tensordict)
        if tensordict is not None:
            result = tensordict.exclude(keys.RESET, keys.NEXT).update(result)
        return result

    def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Step with `tensordict["action"]`; writes and returns `tensordict` with `"next"`."""
        self._check_open()
        next_td = self._step(tensordict)
        tensordict.set(keys.NEXT, next_td)
        return tensordict

    def step_and_maybe_reset(
        self, tensordict: TensorDictBase
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """Step, then build the root of the next step, resetting the sub-envs that are done.

        Returns:
            `(tensordict with "next", root for the next step)`.
        """
        tensordict = self.step(tensordict)
        next_td = tensordict.get(keys.NEXT)
        root = next_td.select(*self.observation_keys, *self.done_keys).clone()
        done = next_td.get(keys.DONE).reshape(self.batch_size)
        if bool(done.any()):
            request = root.clone()
            request.set(keys.RESET, done.reshape(*self.batch_size, 1))
            root = self.reset(request)
        return tensordict, root

    def _reset(self, tensordict: TensorDictBase | None) -> TensorDictBase:
        """TensorDict face of buffer-first envs: reset through the private one-step carrier."""
        scratch = self._scratch_carrier()
        mask = None
        if tensordict is not None:
            # The sub-envs that do not reset keep their observations and flags.
            root_keys = (*self.observation_keys, *self.done_keys)
            present = [key for key in root_keys if key in tensordict.keys(True)]
            if present:
                scratch[..., 0].update_(tensordict.select(*present))
            if keys.RESET in tensordict:
                mask = tensordict.get(keys.RESET).reshape(self.batch_size)
        self.bind(scratch)
        self.reset_into(0, mask)
        return scratch[..., 0].select(*self.observation_keys, *self.done_keys).clone()

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """TensorDict face of buffer-first envs: step through the private one-step carrier."""
        scratch = self._scratch_carrier()
        present = tensordict.keys(include_nested=True)
        missing = [key for key in self.action_keys if key not in present]
        if missing:
            raise KeyError(
                f"{type(self).__name__}.step needs the action entries {missing}; the TensorDict "
                f"has {sorted(map(str, tensordict.keys()))}. Write them with "
                "env.rand_action(td) or a policy."
            )
        time_dim = len(self.batch_size)
        for key in self.action_keys:
            scratch.get(key).select(time_dim, 0).copy_(tensordict.get(key))
        self.bind(scratch)
        self.step_into(0)
        next_td = scratch.get(keys.NEXT)[..., 0]
        result = next_td.clone()
        # The scratch root moves on as a collector's carrier does: sub-envs' transforms read
        # their own state (step counts, reward sums, frame windows) from it at the next step.
        # It is the env's own root, so keys an outer transform rewrote cannot leak in.
        scratch[..., 0].update_(next_td.select(*self.observation_keys, *self.done_keys))
        return result

    def _scratch_carrier(self) -> TensorDictBase:
        if self._scratch is None:
            self._scratch = allocate_carrier(self.full_spec, steps=1, device=self.device)
        return self._scratch

    # --- helpers of the protocol --------------------------------------------------------------

    def rand_action(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """Write a random action from `action_spec` into `tensordict` (a new one if None)."""
        if tensordict is None:
            tensordict = TensorDict({}, batch_size=self.batch_size, device=self.device)
        if self.action_keys == [keys.ACTION]:
            tensordict.set(keys.ACTION, self.action_spec.rand())
            return tensordict
        actions = self.full_action_spec.rand()
        for key in self.action_keys:
            tensordict.set(key, actions.get(key))
        return tensordict

    def set_seed(self, seed: int) -> int:
        """Seed the env (sub-env i gets `seed + i`) and return the next unused seed."""
        self._check_open()
        return self._set_seed(int(seed))

    def _set_seed(self, seed: int) -> int:
        raise NotImplementedError(f"{type(self).__name__} does not support seeding.")

    def rollout(
        self,
        max_steps: int,
        policy: Policy | None = None,
        *,
        auto_reset: bool = True,
        break_when_any_done: bool = True,
        tensordict: TensorDictBase | None = None,
    ) -> TensorDictBase:
        """Run up to `max_steps` steps and return them stacked along a last dim named "time".

        Args:
            max_steps: the number of steps to run.
            policy: a callable `td -> td` writing `"action"`; random actions when None.

        Keyword Args:
            auto_reset: reset before the first step (else start from `tensordict`).
            break_when_any_done: stop after the first step where any sub-env is done;
                otherwise the done sub-envs are reset and the rollout goes on.
            tensordict: the starting root when `auto_reset=False`.
        """
        return run_rollout(self, max_steps, policy, auto_reset, break_when_any_done, tensordict)

    def close(self) -> None:
        """Release the env's resources; a closed env refuses to reset or step."""
        self.is_closed = True

    def _check_open(self) -> None:
        if self.is_closed:
            raise MisuseError(f"{type(self).__name__} is closed; create a new env to go on.")

    def __enter__(self) -> EnvBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(batch_size={tuple(self.batch_size)}, device={self.device})"

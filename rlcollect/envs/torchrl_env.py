"""`TorchRLEnv`: a TorchRL env seen through rlcollect's env protocol (TensorDict face first)."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from rlcollect import keys
from rlcollect.envs.base import EnvBase


def is_torchrl_env(env: Any) -> bool:
    """Whether `env` looks like a TorchRL `EnvBase` (duck-typed: TorchRL stays optional)."""
    module = type(env).__module__
    return module.startswith("torchrl.") or any(
        cls.__module__.startswith("torchrl.envs") for cls in type(env).__mro__
    )


class TorchRLEnv(EnvBase):
    """Wraps a TorchRL env so that rlcollect collectors can drive it.

    The TorchRL env keeps its own specs; its buffer face is derived from its TensorDict face
    through carrier views, so it is slower than a native env but exact.

    Args:
        env: a `torchrl.envs.EnvBase` instance.
    """

    def __init__(self, env: Any) -> None:
        refuse_unsupported_layouts(env)
        super().__init__(env.batch_size, env.device or "cpu")
        self.env = env
        self.observation_spec = env.observation_spec
        self.action_spec = env.action_spec
        self.reward_spec = env.reward_spec
        self.done_spec = env.output_spec["full_done_spec"]

    @property
    def observation_keys(self) -> list[tuple[str, ...]]:
        found = self.env.observation_spec.keys(include_nested=True, leaves_only=True)
        return [key if isinstance(key, tuple) else (key,) for key in found]

    @property
    def done_keys(self) -> list[str]:
        return list(self.env.done_keys)

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

    def reset_into(self, t: int, mask: torch.Tensor | None = None) -> None:
        """Reset with nothing but the reset flags, as TorchRL's collector does: the carrier's
        stale root (zeros at first) must not reach a TorchRL env as the state to reset to
        (envs with state keys, e.g. TorchRL's `PendulumEnv` and its `params`, honour it)."""
        views = self._carrier_views()
        if mask is None:
            result = self.env.reset()
        else:
            flags = mask.reshape((*self.batch_size, 1)).clone()
            request = TensorDict(
                {keys.RESET: flags}, batch_size=self.batch_size, device=self.env.device
            )
            result = self.env.reset(request)
        views.write_root(t, result.exclude(keys.NEXT), mask)

    def step_into(self, t: int) -> None:
        """Step with the root at `t`, and with what the policy already wrote under `"next"`
        (a recurrent state): TorchRL envs keep those entries, as in TorchRL's own collector."""
        views = self._carrier_views()
        request = views.root(t).exclude(keys.NEXT).clone()
        if self._preset_keys:
            request.set(keys.NEXT, views.next(t).select(*self._preset_keys).clone())
        views.write_next(t, self.env.step(request).get(keys.NEXT))

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


def _root_key(key: Any) -> str | None:
    """The key's name when it is at the root (`"done"` or `("done",)`), else None."""
    if isinstance(key, str):
        return key
    return key[0] if len(key) == 1 else None


def refuse_unsupported_layouts(env: Any) -> None:
    """Refuse, at construction, TorchRL envs whose keys the collector cannot write yet: an
    action, reward or done flag that is not at the root (nested keys, several groups), and
    heterogeneous (lazily stacked) specs. Better a clear error now than a crash mid-batch.

    Raises:
        ValueError: naming the env's keys and what is supported.
    """
    layout = {
        "action_keys": list(env.action_keys),
        "reward_keys": list(env.reward_keys),
        "done_keys": list(env.done_keys),
    }
    nested = {
        name: [key for key in found if _root_key(key) is None] for name, found in layout.items()
    }
    if any(nested.values()) or len(layout["action_keys"]) != 1 or len(layout["reward_keys"]) != 1:
        raise ValueError(
            f"{type(env).__name__} has action_keys={layout['action_keys']}, reward_keys="
            f"{layout['reward_keys']}, done_keys={layout['done_keys']}: rlcollect collectors "
            "support one root action, one root reward and root done flags so far; nested or "
            "grouped keys (e.g. ('agents', 'action')) are not supported yet."
        )
    stacked = [
        name
        for name in ("full_observation_spec", "full_action_spec", "full_done_spec")
        if "Stacked" in type(getattr(env, name)).__name__
    ]
    if stacked:
        raise ValueError(
            f"{type(env).__name__} has heterogeneous (lazily stacked) specs ({stacked}): its "
            "sub-envs' entries differ in shape, and rlcollect preallocates one buffer for all "
            "of them. Use sub-envs with the same specs, or TorchRL's collector for this env."
        )


def as_device(value: Any) -> torch.device:
    """`torch.device(value)`, with None meaning the CPU."""
    return torch.device(value) if value is not None else torch.device("cpu")


def _tuple_keys(container: Any) -> set[tuple[str, ...]]:
    """The leaf keys of a spec or TensorDict, as tuples."""
    found = container.keys(include_nested=True, leaves_only=True)
    return {key if isinstance(key, tuple) else (key,) for key in found}

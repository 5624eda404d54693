"""`auto_register_policy_transforms`: the env transforms a recurrent policy needs, added for it.

A recurrent policy (TorchRL's `LSTMModule`, `GRUModule`) reads `"is_init"` to know where an
episode starts, and its state from the root. TorchRL's collector appends `InitTracker` and the
policy's state primer (`TensorDictPrimer`) to the env. So do we:

* on a TorchRL env, TorchRL's own `InitTracker` and the primers the policy declares
  (`torchrl.modules.utils.get_primers_from_module`), appended to the TorchRL env, each only
  when the env's specs lack its keys (idempotent: an env built with `policy=`, or whose
  `SerialEnv` / `ParallelEnv` children hold them, is left as it is);
* on one of our envs, our `InitTracker`; no primer is needed, as the collector carries the
  recurrent state itself (`policy/recurrent_state.py`).

With the default None nothing is added, and a `FutureWarning` says so when something would be
(TorchRL 0.14's default, which flips to True in 0.15); with None or False, a policy that reads
an init flag the env lacks is refused with a `KeyError` naming it, as TorchRL's run fails.
"""

from __future__ import annotations

import warnings
from typing import Any

from rlcollect import keys
from rlcollect.envs.base import EnvBase
from rlcollect.envs.torchrl_env import TorchRLEnv
from rlcollect.transforms import Compose, InitTracker, TransformedEnv


def _produced_keys(env: EnvBase) -> set[Any]:
    """The keys `env` writes at its root: its observations (and state, for a TorchRL env)."""
    if isinstance(env, TorchRLEnv):
        found: set[Any] = set()
        for name in ("full_observation_spec", "full_state_spec"):
            found.update(getattr(env.env, name).keys(include_nested=True, leaves_only=True))
        return found
    return {key[0] if len(key) == 1 else key for key in env.observation_keys}


def missing_init_flags(env: EnvBase, policy: Any) -> list[Any]:
    """The `is_init` keys `policy` reads and `env` does not write."""
    read = getattr(policy, "in_keys", None) or []
    produced = _produced_keys(env)
    return [key for key in read if keys.last_name(key) == keys.IS_INIT and key not in produced]


def _torchrl_primers(env: TorchRLEnv, policy: Any) -> list[Any]:
    """The state primers `policy` declares (TorchRL's) whose keys the env lacks."""
    if not hasattr(policy, "apply"):  # not an nn.Module: nothing to walk
        return []
    from torchrl.envs.transforms import Compose as TorchRLCompose
    from torchrl.modules.utils import get_primers_from_module

    primer = get_primers_from_module(policy, warn=False, strict=False)
    if primer is None:
        return []
    primers = list(primer) if isinstance(primer, TorchRLCompose) else [primer]
    produced = _produced_keys(env)
    return [one for one in primers if not set(one.primers.keys(True, True)) <= produced]


def _torchrl_transforms(env: TorchRLEnv, policy: Any, missing: list[Any]) -> list[Any]:
    """TorchRL's `InitTracker` (when a flag is missing) and the missing primers."""
    from torchrl.envs.transforms import InitTracker as TorchRLInitTracker

    tracker = [TorchRLInitTracker(init_key=keys.IS_INIT)] if missing else []
    return [*tracker, *_torchrl_primers(env, policy)]


def _warn_default(transforms: list[str]) -> None:
    warnings.warn(
        f"the env lacks what the policy needs ({', '.join(transforms)}), and "
        "auto_register_policy_transforms=None (TorchRL 0.14's default) leaves it as it is; "
        "TorchRL 0.15 flips the default to True, which appends them. Pass "
        "auto_register_policy_transforms=True to add them now, or False to keep the env as "
        "it is (and silence this warning).",
        FutureWarning,
        stacklevel=4,
    )


def register_policy_transforms(env: EnvBase, policy: Any, enabled: bool | None) -> EnvBase:
    """`env`, with the transforms `policy` needs appended when `enabled` (see the module).

    Raises:
        TypeError: when `enabled` is not True, False or None.
        KeyError: when the policy reads an init flag the env lacks and `enabled` is not True
            (the policy could not run), naming the flag and the option that adds it.
        ValueError: when `enabled` and the missing flag is nested on one of our envs.
    """
    if enabled not in (None, True, False):
        raise TypeError(
            f"auto_register_policy_transforms must be True, False or None; got {enabled!r}."
        )
    missing = missing_init_flags(env, policy)
    if enabled is False:
        _refuse_missing_flags(missing)
        return env
    torchrl_transforms: list[Any] = []
    if isinstance(env, TorchRLEnv):
        torchrl_transforms = _torchrl_transforms(env, policy, missing)
        names = [type(transform).__name__ for transform in torchrl_transforms]
    else:
        names = ["InitTracker"] if missing else []
    if not names:
        return env
    if enabled is None:
        _warn_default(names)
        _refuse_missing_flags(missing)
        return env
    if isinstance(env, TorchRLEnv):
        inner = env.env
        for transform in torchrl_transforms:
            inner = inner.append_transform(transform)
        return TorchRLEnv(inner)
    if any(not isinstance(key, str) for key in missing):
        raise ValueError(
            f"auto_register_policy_transforms adds a root 'is_init' flag; the policy reads "
            f"{missing}. Add an InitTracker writing those keys to the env yourself."
        )
    return TransformedEnv(env, Compose(*(InitTracker(init_key=key) for key in missing)))


def _refuse_missing_flags(missing: list[Any]) -> None:
    """A `KeyError` (TorchRL's policy call fails with one) naming the init flags the policy
    reads and the env does not write, if any."""
    if missing:
        raise KeyError(
            f"the policy reads {missing}, which the env does not write (a recurrent policy "
            "needs it to know where episodes start). Pass auto_register_policy_transforms=True "
            "to add an InitTracker, or add one to the env yourself."
        )

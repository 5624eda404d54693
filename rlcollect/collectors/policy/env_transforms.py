"""`auto_register_policy_transforms`: the env transforms a recurrent policy needs, added for it.

A recurrent policy (TorchRL's `LSTMModule`, `GRUModule`) reads `"is_init"` to know where an
episode starts. TorchRL's collector can append `InitTracker` (and the policy's state primer) to
the env. We add our `InitTracker` when the policy reads an init flag the env does not write; no
primer is needed, as the collector carries the recurrent state itself (`policy_state.py`).
"""

from __future__ import annotations

from typing import Any

from rlcollect import keys
from rlcollect.envs.base import EnvBase
from rlcollect.transforms import Compose, InitTracker, TransformedEnv


def missing_init_flags(env: EnvBase, policy: Any) -> list[Any]:
    """The `is_init` keys `policy` reads and `env` does not write."""
    read = getattr(policy, "in_keys", None) or []
    produced = {key[0] if len(key) == 1 else key for key in env.observation_keys}
    return [key for key in read if keys.last_name(key) == keys.IS_INIT and key not in produced]


def register_policy_transforms(env: EnvBase, policy: Any, enabled: bool | None) -> EnvBase:
    """`env`, with an `InitTracker` when `enabled` and `policy` reads an init flag it lacks.

    Raises:
        TypeError: when `enabled` is not True, False or None.
        ValueError: when the flag is missing and `enabled` is not True (the policy could not
            run), naming the option that adds it.
    """
    if enabled not in (None, True, False):
        raise TypeError(
            f"auto_register_policy_transforms must be True, False or None; got {enabled!r}."
        )
    missing = missing_init_flags(env, policy)
    if not missing:
        return env
    if not enabled:
        raise ValueError(
            f"the policy reads {missing}, which the env does not write (a recurrent policy "
            "needs it to know where episodes start). Pass auto_register_policy_transforms=True "
            "to add an InitTracker, or add one to the env yourself."
        )
    if any(not isinstance(key, str) for key in missing):
        raise ValueError(
            f"auto_register_policy_transforms adds a root 'is_init' flag; the policy reads "
            f"{missing}. Add an InitTracker writing those keys to the env yourself."
        )
    return TransformedEnv(env, Compose(*(InitTracker(init_key=key) for key in missing)))

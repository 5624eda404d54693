"""TorchRL's `compact_obs=True`: the batch without its `("next", <observation>)` entries.

Each `("next", obs)` of step t is the root `obs` of step t + 1 within a trajectory, so TorchRL's
collectors can leave them out and its `NextStateReconstructor` (a replay-buffer transform)
rebuilds them at sampling time from the root entries, the trajectory ids and `("next", "done")`
(the observation after a trajectory's last step is lost: NaN there). The batch keeps its layout
(`[*B, T]`, every other key in place), unlike our stored-once layout (`store_obs_once=True`,
`rlcollect/batch/compact.py`), which loses nothing but changes the batch's shape.
"""

from __future__ import annotations

from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.batch.compact import paired_observation_keys

Key = tuple[str, ...]


def next_observation_keys(batch: TensorDictBase) -> list[Key]:
    """The `("next", ...)` keys that `compact_obs=True` leaves out: those of
    `paired_observation_keys` (`"observation"`, `"step_count"`, `"is_init"`, a recurrent state,
    a multi-agent group's observations), as TorchRL drops its env's observation and state
    keys. `("next", "reward")` and the done flags stay."""
    return [(keys.NEXT, *key) for key in paired_observation_keys(batch)]


def drop_next_observations(batch: TensorDictBase) -> TensorDictBase:
    """`batch` without its `("next", <observation>)` entries (a new TensorDict sharing the
    tensors of `batch`; nothing is copied)."""
    dropped = next_observation_keys(batch)
    return batch.exclude(*dropped) if dropped else batch


class DropNextObservations:
    """The batch post-processor of `compact_obs=True`: `drop_next_observations`."""

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        return drop_next_observations(batch)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

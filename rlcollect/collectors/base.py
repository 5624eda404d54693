"""`CollectorBase`: the contract every collector keeps, wherever its loop runs.

A collector in this process (`single/`), one over worker processes (`multiprocess/`) and one
over Ray actors (`ray/`) all answer the same calls, so that a parent can drive any of them as
a child and a user can swap one for another:

* iteration: `next()`, `for data in collector`, `len()`, `with collector:`, `shutdown()`;
* weights: `update_policy_weights_` (written once, here) checks the arguments and hands the
  update to `_update_weights`; `apply_weights(weights, version, timeout, worker_ids)` loads
  weights a parent already validated, as policy version `version`, and returns once every
  child below has acknowledged; `policy_version` counts updates;
* state: `state_dict()` / `load_state_dict()` (counters go on, no trajectory id is reused),
  `set_seed(seed)` (returns the next free seed), `reset()` (the next batch starts from a
  reset), `assign_trajectory_ids(offset, stride)` (a parent gives each child its own ids);
* statistics: `stats()` (frames, batches, frames/s, episode returns).

The worker protocol (`multiprocess/worker.py`'s commands) and the Ray actor's methods
(`ray/actor.py`) are this contract carried over a pipe or a Ray call.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from tensordict import TensorDictBase


def one_weights_source(policy_or_weights: Any, weights: Any, policy: Any) -> Any:
    """The one of TorchRL's three ways of passing weights that was used (None: none was).

    Raises:
        ValueError: more than one was given, naming them.
    """
    given = {
        name: value
        for name, value in (
            ("policy_or_weights", policy_or_weights),
            ("weights", weights),
            ("policy", policy),
        )
        if value is not None
    }
    if len(given) > 1:
        raise ValueError(
            f"update_policy_weights_ takes one of policy_or_weights, weights and policy; "
            f"got {sorted(given)}."
        )
    return next(iter(given.values()), None)


class CollectorBase:
    """The contract every collector keeps (see the module docstring); iteration and
    `update_policy_weights_` are written here once, on top of the rest."""

    frames: int
    total_frames: int
    frames_per_batch: int
    policy_version: int  # how many times the policy weights were updated

    # --- weights ----------------------------------------------------------------------------------

    def update_policy_weights_(
        self,
        policy_or_weights: Any = None,
        *,
        weights: Any = None,
        policy: Any = None,
        worker_ids: int | Sequence[int] | None = None,
        timeout: float | None = None,
        policy_id: str | None = None,
    ) -> None:
        """Load new policy weights where the policy runs, and wait until they are in use.

        Weights come as a module, a state dict or a TensorDict of parameters, positionally
        or as `weights=` / `policy=` (one of the three, as in TorchRL). With none, they are
        read again from the policy this collector was given, so that
        `update_policy_weights_()` after an optimiser step on it is enough. With
        `policies=`, `policy_id` addresses one policy: the weights are its own, and the other
        policies keep theirs.

        A collector with children (worker processes, Ray actors) checks the weights against
        the policy's names, shapes and dtypes before anything is sent, sends them to
        `worker_ids` (None: every child) and returns once every child of the tree has
        applied them, within `timeout` seconds (30 by default); the next batch of every leaf
        is then produced by them and reports the new `policy_version`. A `Collector` loads
        them in place (it has no children: `worker_ids` and `timeout` are unused).

        Raises:
            ValueError: more than one source, a missing or extra key, or a tensor of the
                wrong shape or dtype.
            WorkerError / ActorError: a child did not acknowledge within `timeout` seconds
                (the error names its path, e.g. `worker 1 -> worker 0`) or failed.
        """
        source = one_weights_source(policy_or_weights, weights, policy)
        self._update_weights(source, policy_id, worker_ids, timeout)

    def _update_weights(
        self, source: Any, policy_id: str | None, worker_ids: Any, timeout: float | None
    ) -> None:
        raise NotImplementedError

    def apply_weights(
        self,
        weights: Any,
        version: int,
        timeout: float | None = None,
        worker_ids: int | Sequence[int] | None = None,
    ) -> None:
        """Load weights a parent already validated, as policy version `version`, and return
        once every child below has acknowledged (what a parent's update calls in a child)."""
        raise NotImplementedError

    # --- state, seeds, statistics ---------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def set_seed(self, seed: int) -> int:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def assign_trajectory_ids(self, offset: int, stride: int) -> None:
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        raise NotImplementedError

    # --- iteration --------------------------------------------------------------------------------

    def next(self) -> TensorDictBase | None:
        raise NotImplementedError

    def shutdown(self, close_env: bool = True) -> None:
        raise NotImplementedError

    @property
    def is_done(self) -> bool:
        """Whether `total_frames` have been collected (never, for an endless collector)."""
        return 0 < self.total_frames <= self.frames

    def __next__(self) -> TensorDictBase | None:
        return self.next()

    def __iter__(self) -> Iterator[TensorDictBase | None]:
        while not self.is_done:
            try:
                batch = self.next()
            except StopIteration:  # e.g. whole episodes: total_frames ran out mid-episode
                return
            yield batch

    @property
    def yields_whole_episodes(self) -> bool:
        """Whether batches are whole episodes (`batch_mode="complete_episodes"`,
        `trajs_per_batch`): their count then depends on how long the episodes last."""
        return False

    def __len__(self) -> int:
        if self.yields_whole_episodes:
            raise TypeError(
                "a collector of whole episodes has no length: how many batches it yields "
                "depends on how long the episodes last."
            )
        if self.total_frames <= 0:
            raise TypeError("an endless collector (total_frames=-1) has no length.")
        return self.total_frames // self.frames_per_batch

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

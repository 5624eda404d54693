"""`CollectorBase`: the contract every collector keeps, wherever its loop runs.

A collector in this process (`single/`), one over worker processes (`multiprocess/`) and one
over Ray actors (`ray/`) all answer the same calls, so that a parent can drive any of them as
a child and a user can swap one for another:

* iteration: `next()`, `for data in collector`, `len()`, `with collector:`, `shutdown()`;
* weights: `update_policy_weights_` (written once, in `weight_conventions.py`) checks the
  arguments and hands the update to `_update_weights`; `apply_weights(weights, version,
  timeout, worker_ids)` loads weights a parent already validated, as policy version
  `version`, and returns once every child below has acknowledged; `policy_version` counts
  updates;
* state: `state_dict()` / `load_state_dict()` (counters go on, no trajectory id is reused),
  `set_seed(seed)` (returns the next free seed), `reset()` (the next batch starts from a
  reset), `assign_trajectory_ids(offset, stride)` (a parent gives each child its own ids);
* statistics: `stats()` (frames, batches, frames/s, episode returns);
* episodes: `sample(num_timesteps=..., num_episodes=...)` (written once, in
  `episode_sampling.py`, on top of `next()`) hands the batches out as RLlib's EnvRunner
  does, as `Episode`s and chunks of them.

The worker protocol (`multiprocess/worker.py`'s commands) and the Ray actor's methods
(`ray/actor.py`) are this contract carried over a pipe or a Ray call.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from tensordict import TensorDictBase

from rlcollect.collectors.episode_sampling import EpisodeSampling
from rlcollect.collectors.remote_accessors import RemoteAccessors
from rlcollect.collectors.torchrl_abc import register_as_torchrl_collectors
from rlcollect.collectors.weight_conventions import TorchRLWeightConventions

# TorchRL's names for collector classes ("single", "sync", "async"), which its
# `collector_class` arguments take: each class registers its own (`torchrl_shorthand=`).
COLLECTOR_SHORTHANDS: dict[str, type] = {}


class CollectorBase(TorchRLWeightConventions, RemoteAccessors, EpisodeSampling):
    """The contract every collector keeps (see the module docstring): iteration, state,
    seeds, statistics and shutdown here; TorchRL's weight calls
    (`collectors/weight_conventions.py`), its remote accessors (`remote_accessors.py`) and
    RLlib's `sample()` (`episode_sampling.py`) written once beside it, on top of the rest."""

    def __init_subclass__(cls, torchrl_shorthand: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if torchrl_shorthand is not None:
            COLLECTOR_SHORTHANDS[torchrl_shorthand] = cls

    # Whether the class is built from one env maker per worker of its own (a list): a parent
    # that runs it as a child (RayCollector's actors) then hands it a list, as TorchRL's does.
    takes_env_maker_list: bool = False

    frames: int
    total_frames: int
    frames_per_batch: int
    options: Any  # the validated batch options (collectors/options.py's BatchOptions)

    # --- state, seeds, statistics ---------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        raise NotImplementedError

    def reset(self, index: Any = None) -> None:
        raise NotImplementedError

    def assign_trajectory_ids(self, offset: int, stride: int) -> None:
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        raise NotImplementedError

    # --- iteration --------------------------------------------------------------------------------

    def next(self) -> TensorDictBase | None:
        raise NotImplementedError

    def iterator(self) -> Iterator[TensorDictBase | None]:
        """`iter(collector)`, as a method (TorchRL's)."""
        return iter(self)

    def rollout(self) -> TensorDictBase | None:
        """Collect one batch and return it: `next()` under TorchRL's name (it counts towards
        `total_frames`; None when filling a replay buffer)."""
        return self.next()

    def shutdown(
        self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = True
    ) -> None:
        """Stop collecting and release what the collector holds (env, workers, actors);
        idempotent.

        Args:
            timeout: seconds to wait for background collection to stop (None: the
                collector's own bound).
            close_env: close the env(s) too.
            raise_on_error: raise what went wrong while shutting down; False turns it into
                a warning, as TorchRL's.
        """
        try:
            self._shut_down(timeout, close_env)
            self._shut = True
        except Exception as err:
            if raise_on_error:
                raise
            warnings.warn(
                f"{type(self).__name__}.shutdown failed: {err!r}", RuntimeWarning, stacklevel=2
            )

    def _shut_down(self, timeout: float | None, close_env: bool) -> None:
        raise NotImplementedError

    _shut = False

    @property
    def closed(self) -> bool:
        """Whether `shutdown()` has run (TorchRL's `closed`: its launchers read it before
        shutting a node's collector down)."""
        return self._shut

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


# TorchRL's trainers take only a `BaseCollector`: every collector of ours counts as one there.
register_as_torchrl_collectors(CollectorBase)

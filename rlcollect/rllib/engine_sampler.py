"""RLlib's `sample()` on the engine: the runner's vector env as a `GymVectorEnv`, the RLModule as
the policy step, the engine's `RolloutLoop` stepping them; each batch read back as RLlib's
episode chunks. No env is stepped here: only the loop steps it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from ray.rllib.env.env_errors import StepFailedRecreateEnvError
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from tensordict.nn import TensorDictModule

from rlcollect import keys
from rlcollect.collectors.policy.holder import PolicyHolder
from rlcollect.collectors.rollout import RolloutLoop
from rlcollect.envs.step_record import RESET, STEP, StepRecord
from rlcollect.rllib.batch_episodes import BatchReader, Piece, join
from rlcollect.rllib.episode_chunks import build_chunk
from rlcollect.rllib.module_forward import RLModuleForward, RLModulePolicy

logger = logging.getLogger(__name__)

# Steps per batch while sampling whole episodes (batches run until enough episodes finished;
# the steps past the last one needed are not counted, as RLlib's runner stops there).
EPISODE_BATCH_STEPS = 32


class SamplerHost(Protocol):
    """What the sampler needs from its runner: the env, its settings, failures and timing."""

    env: Any
    engine_env: Any
    num_envs: int
    episodes_to_numpy: bool
    lookback: int
    config: Any
    metrics: Any
    worker_index: int | None
    _env_step_seconds: float
    _env_steps_tried: int

    def make_env(self) -> None: ...
    def single_spaces(self) -> tuple[Any, Any]: ...


class EngineSampler:
    """Samples `steps_per_env` steps of every sub-env, or `num_episodes` whole episodes, through
    the engine's rollout loop.

    Every step of every sub-env is a transition: the engine resets a sub-env that ended with
    Gymnasium's reset mask (the vector env's own next-step autoreset, which would spend a step
    on it, never runs). One loop per batch length is kept; a new length goes on from where the
    last loop stands, so episodes continue across `sample()` calls of any size.

    Args:
        host: the runner (env, config, failure handling).
        forward: the RLModule's batched forward.
    """

    def __init__(self, host: SamplerHost, forward: RLModuleForward) -> None:
        self._host = host
        self._forward = forward
        self.batches = 0  # batches the engine's loop collected (for tests and metrics)
        self._bind_env()

    def _bind_env(self) -> None:
        """The host's (re)built engine env, and the policy on it."""
        self.env = self._host.engine_env
        self.record: StepRecord | None = getattr(self.env, "step_record", None)
        probe = self.env.observation_spec[keys.OBSERVATION].zero()
        self.policy = RLModulePolicy(self._forward, probe)
        module = TensorDictModule(
            self.policy, in_keys=[keys.OBSERVATION], out_keys=self.policy.out_keys
        )
        self._holder = PolicyHolder(
            module, [keys.OBSERVATION], self.env.device, device_is_explicit=True
        )
        self._loops: dict[int, RolloutLoop] = {}
        self._current: RolloutLoop | None = None
        self._reset_requested = True
        # Per sub-env, what its next chunk continues: a cut chunk, or None after a reset.
        self.starts: list[SingleAgentEpisode | None] = [None] * self._host.num_envs

    def _loop(self, steps: int) -> RolloutLoop:
        """The loop of `steps` steps per batch, going on from where the env stands."""
        loop = self._loops.get(steps)
        if loop is None:
            loop = RolloutLoop.build(self.env, self._holder, steps, start_from=self._current)
            self._loops[steps] = loop
            if self._current is None:  # building it reset every sub-env
                self._reset_requested = False
        elif self._current is not None and loop is not self._current:
            loop.layout.carry_from(self._current.layout)
        self._current = loop
        return loop

    def reset(self, seed: int | None) -> None:
        """Every sub-env starts a fresh episode at the next batch (seeded when `seed` is given,
        by that reset itself, as RLlib's runner seeds its first)."""
        if hasattr(self.env, "seed_next_reset"):
            self.env.seed_next_reset(seed)
        elif seed is not None:
            self.env.set_seed(seed)
        self._reset_requested = True
        self.starts = [None] * self._host.num_envs

    # --- sampling ------------------------------------------------------------------------------

    def sample_steps(
        self,
        steps_per_env: int,
        *,
        explore: bool,
        random_actions: bool,
        t: Callable[[int], int],
        weights_seq_no: int,
    ) -> tuple[list[SingleAgentEpisode], list[SingleAgentEpisode], int]:
        """`(finished chunks, ongoing chunks, env steps)` after `steps_per_env` steps per env;
        each ongoing episode continues in a cut chunk with the same `id_`."""
        finished: list[SingleAgentEpisode] = []
        while True:
            reader = self._collect(steps_per_env, explore, random_actions, t, weights_seq_no)
            if isinstance(reader, BatchReader):
                break
            finished += reader  # the env failed and was rebuilt: the count starts again
        firsts = self._finish(reader, steps_per_env, finished)
        ongoing: list[SingleAgentEpisode] = []
        for index in range(self._host.num_envs):
            if firsts[index] < steps_per_env:
                piece = reader.piece(index, int(firsts[index]), steps_per_env - 1)
                chunk = self._chunk(index, [piece], reader, None)
                ongoing.append(chunk)
                self.starts[index] = chunk.cut(len_lookback_buffer=self._host.lookback)
        return finished, ongoing, steps_per_env * self._host.num_envs

    def sample_episodes(
        self,
        num_episodes: int,
        *,
        explore: bool,
        random_actions: bool,
        t: Callable[[int], int],
        weights_seq_no: int,
    ) -> tuple[list[SingleAgentEpisode], int]:
        """`(the first num_episodes episodes to finish, env steps)`, from fresh resets.

        Batches of `EPISODE_BATCH_STEPS` run until enough episodes finished; an episode that
        spans batches is joined from its pieces. The steps after the row where the last
        episode needed finished are not counted."""
        num_envs = self._host.num_envs
        finished: list[SingleAgentEpisode] = []
        pieces: list[list[Piece]] = [[] for _ in range(num_envs)]
        rows = 0
        while len(finished) < num_episodes:
            steps = EPISODE_BATCH_STEPS
            offset = rows * num_envs
            reader = self._collect(
                steps,
                explore,
                random_actions,
                lambda n, offset=offset: t(n + offset),
                weights_seq_no,
            )
            if not isinstance(reader, BatchReader):  # the env failed and was rebuilt
                finished += reader
                pieces = [[] for _ in range(num_envs)]
                rows = 0
                continue
            last_row = self._finish(reader, steps, finished, pieces, num_episodes)
            if last_row is None:
                rows += steps
                continue
            rows += last_row + 1
        return finished, rows * num_envs

    def _finish(
        self,
        reader: BatchReader,
        completed: int,
        finished: list[SingleAgentEpisode],
        pieces: list[list[Piece]] | None = None,
        limit: int | None = None,
    ) -> Any:
        """Append the chunks of the episodes that ended in the first `completed` rows to
        `finished`, in the order they ended (row by row, sub-env by sub-env).

        Without `pieces`: returns where each sub-env's unfinished run starts. With `pieces`
        (whole episodes, joined across batches): at most `limit` episodes in all; returns the
        row where the last of them ended, or None when more are needed (each sub-env's
        unfinished run then joins its pieces)."""
        firsts = np.zeros(self._host.num_envs, dtype=np.int64)
        for row, index in zip(*np.nonzero(reader.ends(completed).T), strict=True):
            if limit is not None and len(finished) >= limit:
                break
            piece = reader.piece(index, int(firsts[index]), int(row))
            run = [piece] if pieces is None else [*pieces[index], piece]
            finished.append(self._chunk(index, run, reader, int(row)))
            if pieces is not None:
                pieces[index] = []
                if limit is not None and len(finished) >= limit:
                    return int(row)
            firsts[index] = row + 1
        if pieces is None:
            return firsts
        for index in range(self._host.num_envs):
            if firsts[index] < completed:
                pieces[index].append(reader.piece(index, int(firsts[index]), completed - 1))
        return None

    def _collect(
        self,
        steps: int,
        explore: bool,
        random_actions: bool,
        t: Callable[[int], int],
        weights_seq_no: int,
    ) -> BatchReader | list[SingleAgentEpisode]:
        """One batch of `steps` steps through the engine's loop, read back. When the env
        failed and was rebuilt (RLlib's `restart_failed_sub_environments`): the episodes that
        finished before the failure (RLlib keeps them; the ongoing ones are dropped)."""
        if self._host.engine_env is not self.env:  # the runner rebuilt its env
            self._bind_env()
        self.policy.begin(explore, t)
        record = self.record
        if record is not None:
            record.last_step = -1
        host = self._host
        try:
            loop = self._loop(steps)
            if self._reset_requested:
                loop.stream.needs_reset = True
                self._reset_requested = False
            loop.collect(random_actions)
        except Exception as err:  # the env's own error (or the module's), raised by the loop
            finished: list[SingleAgentEpisode] = []
            completed = -1 if record is None else record.last_step + 1
            if self._current is not None and completed > 0:
                reader = self._reader(self._current, random_actions, weights_seq_no)
                self._finish(reader, completed, finished)
            self.starts = [None] * self._host.num_envs
            self._recover(err)
            return finished
        finally:
            if record is not None:
                seconds, count = record.take_step_time()
                host._env_step_seconds += seconds
                host._env_steps_tried += count
        self.batches += 1
        return self._reader(loop, random_actions, weights_seq_no)

    def _reader(self, loop: RolloutLoop, random_actions: bool, weights_seq_no: int) -> BatchReader:
        return BatchReader(
            loop.layout.carrier,
            self.record,
            self.policy.extra_names,
            {} if random_actions else self.policy.dtypes,
            weights_seq_no,
            random_actions,
        )

    def _recover(self, err: Exception) -> None:
        """After the env raised in the loop: rebuild it (RLlib's `restart_failed_sub_environments`)
        or raise with what failed and which setting would go on."""
        host = self._host
        record = self.record
        phase = None if record is None else record.phase
        if phase == STEP or (phase == RESET and record is not None and record.masked):
            host.metrics.log_value("num_env_step_failures", 1, reduce="lifetime_sum")
        if not host.config.restart_failed_sub_environments:
            if phase == STEP:
                raise RuntimeError(
                    f"env.step() failed in {type(host).__name__} (worker_index="
                    f"{host.worker_index}): {err!r}. To rebuild the env and go on instead, set "
                    "config.fault_tolerance(restart_failed_sub_environments=True)."
                ) from err
            raise err
        if phase is None:  # not the env's own failure (or a backend that cannot tell): raise
            raise err
        if not isinstance(err, StepFailedRecreateEnvError):  # that one asks for quiet
            logger.exception("env.%s() failed; rebuilding the env, resetting every sub-env", phase)
        host.make_env()  # the next batch binds the engine's env to the new one and resets it
        host._needs_initial_reset = False  # the sampler resets every sub-env itself

    def _chunk(
        self, index: int, pieces: list[Piece], reader: BatchReader, end: int | None
    ) -> SingleAgentEpisode:
        """Sub-env `index`'s chunk of `pieces`, ended at row `end` of the last one (None: cut)."""
        terminated = end is not None and bool(reader.terminated[index, end])
        truncated = end is not None and not terminated and bool(reader.truncated[index, end])
        steps = join(pieces, terminated, truncated)
        start, self.starts[index] = self.starts[index], None
        return build_chunk(start, steps, self._host.single_spaces(), self._host.episodes_to_numpy)

"""What RLlib's samplers share on the engine: the runner's engine env, one `RolloutLoop` per
batch length (each going on from where the last stands), resets, one batch run, and RLlib's
fault tolerance (`restart_failed_sub_environments`) around it.

In: the runner (`engine_env`, `config`, `metrics`, `make_env`) and the policy step a sampler
makes (`_make_policy`). Out: batches in the current loop's carrier; the env's error, after the
env was rebuilt, or raised as RLlib's runner raises it.
"""

from __future__ import annotations

import logging
from typing import Any

from ray.rllib.env.env_errors import StepFailedRecreateEnvError
from tensordict.nn import TensorDictModule

from rlcollect import keys
from rlcollect.collectors.policy.holder import PolicyHolder
from rlcollect.collectors.rollout import BatchAbandonedError, LoopFlags, RolloutLoop
from rlcollect.envs.step_record import RESET, STEP, StepRecord

logger = logging.getLogger(__name__)

# Steps per batch while sampling whole episodes (batches run until enough episodes finished;
# the steps past the last one needed are not counted, as RLlib's runner stops there).
EPISODE_BATCH_STEPS = 32


class EngineLoops:
    """The engine's loops over the host's engine env, rebuilt with it.

    Args:
        host: the runner.
    """

    #: Whether the policy step runs under `torch.inference_mode` (False: RLlib's connectors
    #: may keep tensors past the step).
    inference_mode = True

    def __init__(self, host: Any) -> None:
        self._host = host
        # True while the loop collects (the policy step is not called for the engine's probe).
        self.collecting = False
        self.batches = 0  # batches the engine's loop collected (for tests and metrics)
        self._bind_env()

    def _make_policy(self) -> TensorDictModule:
        """The policy step, reading `"observation"` and writing the carrier's action."""
        raise NotImplementedError

    def _bind_env(self) -> None:
        """The host's (re)built engine env, the policy step on it; no loop yet."""
        self.env = self._host.engine_env
        self.record: StepRecord | None = getattr(self.env, "step_record", None)
        self._holder = PolicyHolder(
            self._make_policy(), [keys.OBSERVATION], self.env.device, device_is_explicit=True
        )
        self._loops: dict[int, RolloutLoop] = {}
        self._current: RolloutLoop | None = None
        self._reset_requested = True

    def _loop(self, steps: int) -> RolloutLoop:
        """The loop of `steps` steps per batch, going on from where the env stands."""
        loop = self._loops.get(steps)
        if loop is None:
            flags = LoopFlags(inference_mode=self.inference_mode)
            loop = RolloutLoop.build(
                self.env, self._holder, steps, flags=flags, start_from=self._current
            )
            self._loops[steps] = loop
            if self._current is None:  # building it reset every sub-env
                self._reset_requested = False
        elif self._current is not None and loop is not self._current:
            loop.layout.carry_from(self._current.layout)
        self._current = loop
        return loop

    def request_reset(self, seed: int | None) -> None:
        """Every sub-env starts a fresh episode at the next batch (seeded when `seed` is given,
        by that reset itself where the env can, as RLlib's runner seeds its first)."""
        if hasattr(self.env, "seed_next_reset"):
            self.env.seed_next_reset(seed)
        elif seed is not None:
            self.env.set_seed(seed)
        self._reset_requested = True

    def _run(self, steps: int, random_actions: bool) -> tuple[RolloutLoop | None, Exception | None]:
        """Collect one batch of `steps` steps: `(the loop, None)`; when the env (or the module)
        raised: `(the loop, or None if none was built, the error)`, the env not yet rebuilt
        (`recover`). A batch the policy step abandoned (enough whole episodes) raises
        `BatchAbandonedError`; the next batch starts from a reset."""
        if self._host.engine_env is not self.env:  # the runner rebuilt its env
            self._bind_env()
        record = self.record
        if record is not None:
            record.last_step = -1
        try:
            loop = self._loop(steps)
            if self._reset_requested:
                loop.stream.needs_reset = True
                self._reset_requested = False
            self.collecting = True
            loop.collect(random_actions)
        except BatchAbandonedError:
            raise
        except Exception as err:
            return self._current, err
        finally:
            self.collecting = False
            if record is not None:
                seconds, count = record.take_step_time()
                self._host._env_step_seconds += seconds
                self._host._env_steps_tried += count
        self.batches += 1
        return loop, None

    def completed_steps(self) -> int:
        """The steps of the failed batch that completed (0 without a step record)."""
        return 0 if self.record is None else self.record.last_step + 1

    def recover(self, err: Exception) -> None:
        """After the env raised in the loop: rebuild it (RLlib's `restart_failed_sub_environments`;
        the next batch binds the new one and resets it) or raise as RLlib's runner does, saying
        what failed and which setting would go on."""
        host, record = self._host, self.record
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
            logger.error(
                "env.%s() failed; rebuilding the env, resetting every sub-env",
                phase,
                exc_info=err,
            )
        host.make_env()
        host._needs_initial_reset = False  # the sampler resets every sub-env itself

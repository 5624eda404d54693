"""`EpisodeRunner`: one env, one policy and a `Collector` that plays whole evaluation episodes.

Every backend runs one: in a thread of this process, in a worker process, or in a Ray actor.
An evaluation loads the weights it is given, starts every sub-env from a reset, collects
batches until `num_trajectories` episodes have ended (joined across batches by
`EpisodeJoiner`), and measures exactly those; what was still running is dropped, so every
episode measured was played from its first step by the weights of this evaluation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
from tensordict import TensorDictBase
from torch import nn

from rlcollect import keys
from rlcollect.batch.episodes import EpisodeJoiner
from rlcollect.collectors.evaluation.env_transforms import (
    dump_recordings,
    freeze_running_statistics,
)
from rlcollect.collectors.evaluation.metrics import custom_metrics, episode_metrics
from rlcollect.collectors.evaluation.settings import EvaluationSettings, build_policy, is_env
from rlcollect.collectors.policy.weights import validated_weights
from rlcollect.collectors.single.collector import Collector
from rlcollect.collectors.weights.schemes import POLICY_MODEL_ID
from rlcollect.transforms.split import split_trajectories


class EvaluationCancelledError(Exception):
    """An evaluation given up half-way (the evaluator is shutting down)."""


class StopSignal:
    """The collector's interruptor: asks the running evaluation's `stop` after every env
    step, so that a shutdown ends a long batch at its next step rather than at its end."""

    def __init__(self) -> None:
        self.stop: Callable[[], bool] = lambda: False

    def collection_stopped(self) -> bool:
        return self.stop()


def counts_steps(env: Any) -> bool:
    """Whether `env` counts steps itself (a `StepCounter`): its own limit then ends the
    episodes, and `max_steps` adds no second counter (as TorchRL's evaluator leaves it)."""
    return keys.STEP_COUNT in env.observation_spec


class EpisodeRunner:
    """Plays whole episodes of `env` with `policy` and measures them.

    Args:
        env: an env (ours or TorchRL's); its running statistics are frozen.
        policy: the policy (an `nn.Module`, a TensorDict module, or any callable the
            `Collector` accepts).
        settings: the evaluation's settings.
    """

    def __init__(self, env: Any, policy: Any, settings: EvaluationSettings) -> None:
        self.env = freeze_running_statistics(env)
        self.policy = policy
        self.settings = settings
        self.signal = StopSignal()
        self.collector = Collector(
            env,
            policy,
            frames_per_batch=settings.frames_per_batch_for(env),
            max_frames_per_traj=None if counts_steps(env) else settings.max_steps,
            exploration_type=settings.exploration_type,
            interruptor=self.signal,
            **settings.collector_kwargs,
        )

    @classmethod
    def build(
        cls,
        env: Any,
        policy: Any,
        policy_factory: Callable[..., Any] | None,
        settings: EvaluationSettings,
        *,
        factory_takes_env: bool = True,
    ) -> EpisodeRunner:
        """The runner of an env or env factory, and a policy or the one `policy_factory`
        builds (see `build_policy` for `factory_takes_env`)."""
        env = env if is_env(env) else env()
        if policy_factory is not None:
            policy = build_policy(policy_factory, env, with_env=factory_takes_env)
        return cls(env, policy, settings)

    def load(self, weights: Mapping[str, Any]) -> None:
        """Load `{model_id: weights}` as the collectors take them: `"policy"`, or the
        attribute path of another model (e.g. `"env.transform[0]"`).

        Raises:
            TypeError: weights for a policy that is no module with weights.
        """
        weights = dict(weights)
        if POLICY_MODEL_ID in weights:
            template = self.policy_state()
            if not template:
                raise TypeError(
                    f"weights were given, but the evaluation policy "
                    f"({type(self.policy).__name__}) has none to load: loading weights "
                    "requires an nn.Module policy with parameters or buffers. Leave weights "
                    "out, or evaluate a module."
                )
            weights[POLICY_MODEL_ID] = validated_weights(weights[POLICY_MODEL_ID], template)
        self.collector.update_policy_weights_(weights_dict=weights)

    def run(
        self,
        weights: Mapping[str, Any] | None,
        step: int,
        stop: Callable[[], bool] = lambda: False,
    ) -> dict[str, Any]:
        """Load `weights` (if any), play `num_trajectories` whole episodes and return their
        raw metrics (see `metrics.py`); `stop` is asked after every env step.

        Raises:
            EvaluationCancelledError: `stop` answered True.
        """
        if weights:
            self.load(weights)
        training = isinstance(self.policy, nn.Module) and self.policy.training
        if training:
            self.policy.eval()
        self.signal.stop = stop
        try:
            episodes, frames, seconds = self._play(stop)
        finally:
            self.signal.stop = lambda: False
            if training:
                self.policy.train()
        batch = self._layout(episodes)
        raw = episode_metrics(episodes, self.settings.reward_key, seconds=seconds, frames=frames)
        raw.update(custom_metrics(self.settings.metrics_fn, batch))
        if self.settings.dump_video:
            dump_recordings(self.env, step)
        return raw

    def _play(self, stop: Callable[[], bool]) -> tuple[list[TensorDictBase], int, float]:
        """The first `num_trajectories` episodes to end, from a reset of every sub-env; the
        frames stepped and the seconds it took."""
        wanted = self.settings.num_trajectories
        joiner = EpisodeJoiner(end_keys=self.settings.end_keys)
        if self.settings.seed is not None:  # the same first states every time
            self.collector.set_seed(self.settings.seed)
        self.collector.reset()
        episodes: list[TensorDictBase] = []
        frames, start = 0, time.perf_counter()
        while len(episodes) < wanted:
            batch = cast(TensorDictBase, self.collector.next())
            if stop():  # the batch may have been cut short by it
                raise EvaluationCancelledError
            frames += batch.numel()
            episodes.extend(episode.transitions for episode in joiner.add(batch))
        return episodes[:wanted], frames, time.perf_counter() - start

    def _layout(self, episodes: list[TensorDictBase]) -> TensorDictBase:
        """The episodes as one batch, as TorchRL's `trajs_per_batch` lays them out: "padded"
        (`[N, max_len]` with `("collector", "mask")`) or "cat" (flat)."""
        flat = cast(TensorDictBase, torch.cat(episodes, 0))  # type: ignore[arg-type]
        flat.refine_names(keys.TIME_DIM_NAME)
        return flat if self.settings.traj_format == "cat" else split_trajectories(flat)

    def policy_state(self) -> dict[str, Any]:
        """The state dict of the policy the collector runs (empty for one without weights)."""
        return dict(self.collector.policy_holder.state_dict())

    def close(self) -> None:
        """Shut the collector down and close the env."""
        self.collector.shutdown()

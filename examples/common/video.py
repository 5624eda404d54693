"""`EvaluationVideo`: greedy episodes recorded to `<run dir>/videos/*.mp4` by Gymnasium's
`RecordVideo`, and handed to the run's experiment logger."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
from gymnasium.wrappers import RecordVideo
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf
from tensordict.nn import InteractionType, set_interaction_type

from rlcollect import keys
from rlcollect.envs import GymEnv

from .config import ConfigError, require_bool, require_nonnegative_int, require_positive_int
from .loggers import ExperimentLogger

log = logging.getLogger(__name__)  # Hydra sends it to the console and the job log

VIDEOS_DIR = "videos"


def gym_env_node(cfg: DictConfig) -> dict[str, Any]:
    """The config of the `GymEnv` the run's env is made of (`env.make`, or the
    `create_env_fn` of a batched env), resolved.

    Raises:
        ConfigError: when the env is not made of Gymnasium envs (`RecordVideo` wraps one).
    """
    for key in ("env.make", "env.make.create_env_fn"):
        node = OmegaConf.select(cfg, key, default=None)
        if isinstance(node, DictConfig) and "_target_" in node:
            try:
                target = get_object(node["_target_"])
            except Exception:  # a bad target is reported, by name, when the env is built
                continue
            if target is GymEnv:
                return dict(OmegaConf.to_container(node, resolve=True))  # type: ignore[arg-type]
    raise ConfigError(
        f"video.enabled=true: videos are recorded from a Gymnasium env, but env.make "
        f"({OmegaConf.select(cfg, 'env.make._target_')}) is neither a rlcollect.envs.GymEnv nor "
        "a batched env of them. Pick such an env (e.g. env=cartpole) or video.enabled=false."
    )


def check_video_config(cfg: DictConfig) -> None:
    """Check the `video` node before any work: `enabled` a bool, `every` an int >= 0,
    `max_steps` a positive int, and, when enabled, an env made of Gymnasium envs.

    Raises:
        ConfigError: naming the key.
    """
    require_bool(cfg, "video.enabled")
    require_nonnegative_int(cfg, "video.every")
    require_positive_int(cfg, "video.max_steps")
    if cfg.video.enabled:
        gym_env_node(cfg)


class EvaluationVideo:
    """Records one greedy episode of a policy (the end of a run's evaluation, and every
    `video.every` iterations when set) with Gymnasium's `RecordVideo` on a fresh env made
    from the run's env config with `render_mode="rgb_array"`.

    A video of an episode of n steps has n + 1 frames (the reset's, then one per step), at
    the env's `render_fps`. Files are `<run dir>/videos/eval-<frames>-episode-0.mp4`, and
    `final-<frames>-episode-0.mp4` for the one at the end.

    Args:
        cfg: the run's config (`video.enabled`, `video.every`, `video.max_steps`, `env`).
        run_dir: the run directory.
        logger: the run's experiment logger, which gets each video.
    """

    def __init__(self, cfg: DictConfig, run_dir: Path, logger: ExperimentLogger) -> None:
        check_video_config(cfg)
        self.enabled = bool(cfg.video.enabled)
        self.every = int(cfg.video.every)
        self.max_steps = int(cfg.video.max_steps)
        self.folder = Path(run_dir) / VIDEOS_DIR
        self.logger = logger
        self._make: dict[str, Any] = {}
        self._categorical = False
        if self.enabled:
            node = gym_env_node(cfg)
            self._categorical = bool(node.pop("categorical_action_encoding", False))
            for name in ("_target_", "_partial_"):
                node.pop(name, None)
            self._make = node

    def due(self, iteration: int, last: bool = False) -> bool:
        """Whether a video is due after `iteration` (counted from 1) of training; never after
        the `last` one, whose video the end of the run records."""
        return self.enabled and self.every > 0 and iteration % self.every == 0 and not last

    def record(self, policy: Any, frames: int, seed: int, final: bool = False) -> Path | None:
        """Record a greedy episode of `policy` (a TensorDict module) seeded with `seed`, at
        `frames` frames of training (the `final` one: at the end of the run); None when
        videos are off."""
        if not self.enabled:
            return None
        make = dict(self._make)
        gym_env = gym.make(make.pop("env"), render_mode="rgb_array", **make)
        gym_env.reset(seed=seed)  # the recorded episode starts at the next reset
        gym_env.action_space.seed(seed)
        name = f"{'final' if final else 'eval'}-{frames}"
        with warnings.catch_warnings():  # one folder for all of a run's videos is the plan
            warnings.filterwarnings("ignore", "(?s).*Overwriting existing videos")
            recorded = RecordVideo(
                gym_env,
                str(self.folder),
                episode_trigger=lambda episode: episode == 0,
                name_prefix=name,
                disable_logger=True,
            )
        env = GymEnv(recorded, categorical_action_encoding=self._categorical)
        try:
            with (
                torch.random.fork_rng(),
                torch.no_grad(),
                set_interaction_type(InteractionType.DETERMINISTIC),
            ):
                episode = env.rollout(self.max_steps, policy)
        finally:
            env.close()  # RecordVideo writes the file
        path = self.folder / f"{name}-episode-0.mp4"
        episode_return = float(episode.get((keys.NEXT, keys.REWARD)).sum())
        log.info(
            f"video {path}: a greedy episode of {episode.shape[-1]} steps, "
            f"return {episode_return:.1f}"
        )
        self.logger.log_video(path, frames)
        return path

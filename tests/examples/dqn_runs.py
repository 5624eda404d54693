"""The overrides that make examples/dqn.py's run tiny (`TINY`)."""

from __future__ import annotations

TINY = (
    "collector.frames_per_batch=32",
    "collector.init_random_frames=256",
    "dqn.learning_starts=256",
    "log_every=512",
    "checkpoint_every=1024",
    "eval_episodes=1",
    "eval_every=1024",
    "progress=false",
)

"""The overrides that make examples/mappo.py's run tiny (`TINY`); MAPPO's env needs mpe2."""

from __future__ import annotations

import pytest

pytest.importorskip("mpe2")

TINY = ("env.num_envs=2", "collector.frames_per_batch=100", "eval_episodes=2", "progress=false")

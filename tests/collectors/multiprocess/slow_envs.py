"""A counting env whose steps take 50 ms (`slow_counting_env`): the worker running it is last."""

from __future__ import annotations

import time

from rlcollect.testing import CountingEnv


class SlowCountingEnv(CountingEnv):
    """A counting env whose steps take 50 ms: the worker that runs it finishes last."""

    def step_into(self, t: int) -> None:
        time.sleep(0.05)
        super().step_into(t)


def slow_counting_env() -> CountingEnv:
    return SlowCountingEnv(episode_length=4)

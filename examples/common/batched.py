"""`collector=batched`: TorchRL's `AsyncBatchedCollector` over the script's env factory.

The scripts hand every collector one env factory and the policy; the batched collector takes
one env maker per env, so this repeats the factory `num_envs` times. Env worker processes then
only step envs, and one inference server batches the policy calls of all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlcollect.collectors import AsyncBatchedCollector


class ExampleBatchedCollector(AsyncBatchedCollector):
    """An `AsyncBatchedCollector` over `num_envs` envs made by `create_env_fn`.

    Raises:
        ValueError: `num_envs` is not a positive int, or `init_random_frames` is set (the
            batched collector has no random warm-up, as TorchRL's has none).
    """

    def __init__(
        self,
        create_env_fn: Callable[[], Any],
        policy: Any,
        num_envs: int,
        init_random_frames: int | None = None,
        **options: Any,
    ) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"collector.num_envs={num_envs!r}: expected a positive int.")
        if init_random_frames:
            raise ValueError(
                f"collector.init_random_frames={init_random_frames}: the batched collector's "
                "actions all come from its inference server (TorchRL's AsyncBatchedCollector "
                "has no random warm-up); set collector.init_random_frames=null."
            )
        super().__init__([create_env_fn] * num_envs, policy=policy, **options)

"""`enable_profile()` / `disable_profile()`: TorchRL's rollout profiling, with PyTorch's profiler.

The profiler runs over whole batches: the first `warmup_rollouts` batches warm it up (their data
is discarded), the next ones up to `num_rollouts` are recorded, then the trace is exported as a
Chrome trace to `save_path` (`{worker_idx}` filled in) or handed to `on_trace_ready`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import profiler

DEFAULT_SAVE_PATH = "./collector_profile_{worker_idx}.json"
_ACTIVITIES = {"cpu": profiler.ProfilerActivity.CPU, "cuda": profiler.ProfilerActivity.CUDA}


@dataclass
class ProfileConfig:
    """What `enable_profile()` was asked; checked when built, so a bad value fails there."""

    workers: list[int] = field(default_factory=lambda: [0])
    num_rollouts: int = 3
    warmup_rollouts: int = 1
    save_path: str | Path | None = None
    activities: list[str] | None = None
    record_shapes: bool = True
    profile_memory: bool = False
    with_stack: bool = True
    with_flops: bool = False
    on_trace_ready: Callable[[Any], None] | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.warmup_rollouts < self.num_rollouts:
            raise ValueError(
                f"enable_profile needs 0 <= warmup_rollouts < num_rollouts; got "
                f"warmup_rollouts={self.warmup_rollouts}, num_rollouts={self.num_rollouts}."
            )
        unknown = [name for name in self.activities or [] if name not in _ACTIVITIES]
        if unknown:
            raise ValueError(
                f"enable_profile activities {unknown} are not known; use 'cpu' and/or 'cuda'."
            )

    def trace_path(self, worker_idx: int) -> Path:
        return Path(str(self.save_path or DEFAULT_SAVE_PATH).format(worker_idx=worker_idx))


class RolloutProfiler:
    """One profiling session over `config.num_rollouts` batches; `step()` after each batch."""

    def __init__(self, config: ProfileConfig, worker_idx: int) -> None:
        self.config = config
        names = config.activities or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
        self.trace_path = config.trace_path(worker_idx)
        on_ready = config.on_trace_ready or self._export
        self.done = False
        self._profile = profiler.profile(
            activities=[_ACTIVITIES[name] for name in names],
            schedule=profiler.schedule(
                wait=0,
                warmup=config.warmup_rollouts,
                active=config.num_rollouts - config.warmup_rollouts,
                repeat=1,
            ),
            on_trace_ready=on_ready,
            record_shapes=config.record_shapes,
            profile_memory=config.profile_memory,
            with_stack=config.with_stack,
            with_flops=config.with_flops,
        )
        self._remaining = config.num_rollouts
        self._profile.start()

    def _export(self, session: Any) -> None:
        self.trace_path.parent.mkdir(parents=True, exist_ok=True)
        session.export_chrome_trace(str(self.trace_path))

    def step(self) -> None:
        """One batch was collected; the session ends (and exports) after the last one."""
        if self.done:
            return
        self._profile.step()
        self._remaining -= 1
        if self._remaining == 0:
            self.stop()

    def stop(self) -> None:
        """End the session now (what was recorded is exported)."""
        if not self.done:
            self.done = True
            self._profile.stop()


class ProfilingHook:
    """The post-collect hook while profiling, as in TorchRL: it calls the user's own hook
    (if any) and then counts the batch for the profiler; `disable_profile()` puts the user's
    hook back."""

    def __init__(self, profiler: RolloutProfiler, user_hook: Callable[[Any], None] | None) -> None:
        self.profiler = profiler
        self.user_hook = user_hook

    def __call__(self, batch: Any) -> None:
        if self.user_hook is not None:
            self.user_hook(batch)
        self.profiler.step()

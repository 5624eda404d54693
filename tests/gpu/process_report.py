"""An env that reports, at every step, the process it runs in and what that process did with
CUDA; for worker-process tests. Importing this module makes no CUDA call (a worker imports it
to build the env)."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from rlcollect import keys
from rlcollect.envs.base import EnvBase
from rlcollect.envs.specs import Categorical, Composite, Unbounded

# torch.cuda's entry points that reach the driver (or would create a context).
CUDA_ENTRY_POINTS = (
    "is_available",
    "device_count",
    "current_device",
    "set_device",
    "init",
    "_lazy_init",
    "synchronize",
    "current_stream",
)


class CudaCalls:
    """Counts the calls of torch.cuda's entry points in this process once `watch()` ran."""

    count = 0

    @classmethod
    def watch(cls) -> None:
        """Wrap the entry points (once per process) so that each call is counted. Only in a
        child process: the test process keeps torch.cuda as it is."""
        if multiprocessing.parent_process() is None or getattr(torch.cuda, "_calls_counted", 0):
            return
        for name in CUDA_ENTRY_POINTS:
            setattr(torch.cuda, name, cls._counted(getattr(torch.cuda, name)))
        torch.cuda._calls_counted = 1  # type: ignore[attr-defined]

    @classmethod
    def _counted(cls, function: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            cls.count += 1
            return function(*args, **kwargs)

        return counted


class ProcessReportEnv(EnvBase):
    """A single env observing its own process: `"pid"` `[1]` int64, `"cuda_initialized"` `[1]`
    bool (`torch.cuda.is_initialized()` there) and `"cuda_calls"` `[1]` int64 (calls of
    torch.cuda's entry points in that process since the env was built; counted in child
    processes only), read at every reset and step, beside an `"observation"` `[3]` of zeros
    for the policy to read.

    Episodes never end; the action (`Unbounded(1)`, as Pendulum's) changes nothing, and the
    reward is the action, so a batch shows which weights acted.
    """

    def __init__(self) -> None:
        super().__init__()
        CudaCalls.watch()
        self.observation_spec = Composite(
            observation=Unbounded(shape=(3,)),
            pid=Unbounded(shape=(1,), dtype=torch.int64),
            cuda_initialized=Categorical(2, shape=(1,), dtype=torch.bool),
            cuda_calls=Unbounded(shape=(1,), dtype=torch.int64),
        )
        self.action_spec = Unbounded(shape=(1,))
        self.reward_spec = Unbounded(shape=(1,))
        flag = Categorical(2, shape=(1,), dtype=torch.bool)
        self.done_spec = Composite(dict.fromkeys(keys.DONE_KEYS, flag))

    def _report(self) -> TensorDict:
        flags = {name: torch.zeros(1, dtype=torch.bool) for name in keys.DONE_KEYS}
        return TensorDict(
            {
                "observation": torch.zeros(3),
                "pid": torch.tensor([os.getpid()]),
                "cuda_initialized": torch.tensor([torch.cuda.is_initialized()]),
                "cuda_calls": torch.tensor([CudaCalls.count]),
                **flags,
            }
        )

    def _reset(self, tensordict: TensorDictBase | None) -> TensorDictBase:
        return self._report()

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._report().set(keys.REWARD, tensordict.get(keys.ACTION).clone())

    def _set_seed(self, seed: int) -> int:
        return seed + 1

"""Picklable parts of the Evaluator tests: envs, policies whose weights show in the episodes,
and metrics that say where the episodes were played."""

from __future__ import annotations

import functools
import os
import threading
import time
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

from rlcollect.testing import CountingEnv
from rlcollect.transforms import Compose, TransformedEnv
from rlcollect.transforms.base import Transform


class SignAction(nn.Module):
    """Plays action 1 when its one weight is positive, else 0, whatever it observes: the
    actions of an episode tell which weights played it."""

    def __init__(self, sign: float = -1.0, delay: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor([sign]))
        self.delay = delay

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        action = (self.weight[0] > 0).long().expand(observation.shape[:-1])
        return action.clone()


def sign_policy(sign: float = -1.0, delay: float = 0.0) -> TensorDictModule:
    return TensorDictModule(SignAction(sign, delay), in_keys=["observation"], out_keys=["action"])


def sign_policy_factory(env: Any = None) -> TensorDictModule:
    """`policy_factory` of every backend: the env is not needed."""
    return sign_policy()


def slow_policy_factory(env: Any = None) -> TensorDictModule:
    return sign_policy(delay=0.01)


class GatedAction(SignAction):
    """`SignAction` that waits for `gate` before every step (but the collector's probe call
    at construction): an evaluation stays pending until the test opens it."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate
        self.calls = 0

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls > 1:
            self.gate.wait(timeout=30)
        return super().forward(observation)


def gated_policy(gate: threading.Event) -> TensorDictModule:
    return TensorDictModule(GatedAction(gate), in_keys=["observation"], out_keys=["action"])


def counting_env(episode_length: int = 5, batch_size: tuple[int, ...] = ()) -> Any:
    """A picklable maker of the counting env (reward 1 per step: the return is the length)."""
    return functools.partial(CountingEnv, episode_length=episode_length, batch_size=batch_size)


def where_and_what(batch: TensorDictBase) -> dict[str, float]:
    """`metrics_fn`: the process that played the episodes, and their mean action (a flat
    "cat" batch: every entry a real step)."""
    return {"pid": float(os.getpid()), "action": float(batch.get("action").float().mean())}


class Recorder(Transform):
    """A transform with running statistics and a recording, as TorchRL's `VecNorm` and
    `VideoRecorder` have: `freeze()` and `dump(step=...)` (each dump appended to a file)."""

    def __init__(self, path: str | None = None) -> None:
        super().__init__()
        self.frozen = False
        self.path = path
        self.dumps: list[int] = []

    def freeze(self) -> None:
        self.frozen = True

    def dump(self, step: int | None = None) -> None:
        self.dumps.append(int(step or 0))
        if self.path is not None:
            with open(self.path, "a") as file:
                file.write(f"{step} {os.getpid()}\n")


def recorded_env(path: str | None = None, episode_length: int = 5) -> TransformedEnv:
    return TransformedEnv(CountingEnv(episode_length=episode_length), Compose(Recorder(path)))


def dying_env(after_steps: int) -> Any:
    """A counting env whose process ends (exit code 3) at step `after_steps`."""
    return functools.partial(DyingEnv, after_steps)


class DyingEnv(CountingEnv):
    def __init__(self, after_steps: int) -> None:
        super().__init__(episode_length=1000)
        self.after_steps, self.steps = after_steps, 0

    def step_into(self, *args: Any, **kwargs: Any) -> Any:
        self.steps += 1
        if self.steps >= self.after_steps:
            os._exit(3)
        return super().step_into(*args, **kwargs)


def raising_env(after_steps: int) -> Any:
    """A counting env that raises at step `after_steps`."""
    return functools.partial(RaisingEnv, after_steps)


class RaisingEnv(DyingEnv):
    def step_into(self, *args: Any, **kwargs: Any) -> Any:
        self.steps += 1
        if self.steps >= self.after_steps:
            raise RuntimeError(f"the evaluation env broke at step {self.steps}")
        return CountingEnv.step_into(self, *args, **kwargs)


def mark_init() -> None:
    """`init_fn`: leaves a mark in the worker's environment that `init_seen` reads."""
    os.environ["RLC_EVALUATION_INIT"] = str(os.getpid())


def init_seen(batch: TensorDictBase) -> dict[str, float]:
    return {"init_pid": float(os.environ.get("RLC_EVALUATION_INIT", "-1"))}


def slowly_built_env() -> CountingEnv:
    """An env whose construction takes a minute (a simulator starting up)."""
    time.sleep(60)
    return CountingEnv()

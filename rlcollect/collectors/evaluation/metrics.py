"""Metrics of whole evaluation episodes, and the flat, prefixed result an `Evaluator` returns.

An evaluation hands back raw metrics (`reward`, `reward_std`, `num_episodes`, `episode_length`,
`fps`, `frames`, and `custom/<name>` from the user's `metrics_fn`); `result_from` names them as
TorchRL's `Evaluator` does: `"<prefix>/reward"`, ..., `"<prefix>/step"`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from rlcollect import keys

NestedKey = str | tuple[str, ...]
# A RewardSum transform's running return, read at an episode's last step when present.
EPISODE_REWARD_KEY = (keys.NEXT, keys.EPISODE_REWARD)
# The raw metrics a result carries, in TorchRL's order.
REPORTED = ("reward", "reward_std", "num_episodes", "episode_length", "fps")
CUSTOM_PREFIX = "custom/"


def episode_return(episode: TensorDictBase, reward_key: NestedKey) -> float:
    """The return of one whole episode (`[T]`, time first): a `RewardSum`'s
    `("next", "episode_reward")` at its last step when the env has one, else the sum of
    `reward_key` over its steps (over agents too, for a group's reward, as TorchRL sums it)."""
    running = episode.get(EPISODE_REWARD_KEY, None)
    if running is not None:
        return float(running[-1].sum())
    return float(episode.get(reward_key).sum())


def episode_metrics(
    episodes: Sequence[TensorDictBase],
    reward_key: NestedKey,
    *,
    seconds: float,
    frames: int,
) -> dict[str, Any]:
    """Raw metrics of whole episodes: mean and standard deviation of their returns, their
    count, mean length, and the frames stepped per second (`frames` in `seconds`).

    With no episode, the reward and length are NaN (as TorchRL reports them).
    """
    returns = torch.tensor([episode_return(e, reward_key) for e in episodes], dtype=torch.float64)
    lengths = [int(episode.shape[0]) for episode in episodes]
    count = len(lengths)
    return {
        "reward": float(returns.mean()) if count else math.nan,
        "reward_std": float(returns.std()) if count > 1 else (0.0 if count else math.nan),
        "num_episodes": count,
        "episode_length": sum(lengths) / count if count else math.nan,
        "fps": frames / seconds if seconds > 0 else math.nan,
        "frames": frames,
    }


def custom_metrics(
    metrics_fn: Callable[[TensorDictBase], Mapping[str, Any]] | None, batch: TensorDictBase
) -> dict[str, Any]:
    """The user's metrics of the episodes' batch, under `custom/<name>`.

    Raises:
        TypeError: `metrics_fn` did not return a mapping of names to values.
    """
    if metrics_fn is None:
        return {}
    custom = metrics_fn(batch)
    if not isinstance(custom, Mapping):
        raise TypeError(
            f"metrics_fn must return a dict of metric names to values; it returned "
            f"{type(custom).__name__}."
        )
    return {f"{CUSTOM_PREFIX}{name}": value for name, value in custom.items()}


def result_from(raw: Mapping[str, Any], prefix: str, step: int) -> dict[str, Any]:
    """The result of an evaluation: its raw metrics named `"<prefix>/<name>"` (the user's
    custom ones too), and `"<prefix>/step"`."""
    result = {f"{prefix}/{name}": raw[name] for name in REPORTED if name in raw}
    for name, value in raw.items():
        if name.startswith(CUSTOM_PREFIX):
            result[f"{prefix}/{name.removeprefix(CUSTOM_PREFIX)}"] = value
    result[f"{prefix}/step"] = step
    return result


def result_tensordict(result: Mapping[str, Any]) -> TensorDict:
    """A result as the flat TensorDict `on_result` receives (each value a CPU tensor)."""
    data = {
        name: value.detach().cpu() if isinstance(value, torch.Tensor) else torch.as_tensor(value)
        for name, value in result.items()
        if value is not None
    }
    return TensorDict(data, batch_size=[])

"""`replay_next_step_loop`: a vector env's own loop under next-step autoreset, replayed with the
actions of a batch, to check what an env wrapper made of it."""

from __future__ import annotations

from typing import Any

import numpy as np
from tensordict import TensorDictBase

from rlcollect import keys

FIELDS = ("observation", "action", "next_observation", "reward", "terminated", "truncated")


def replay_next_step_loop(
    vector_env: Any, observation: np.ndarray, actions: np.ndarray
) -> dict[str, np.ndarray]:
    """Step `vector_env` (a Gymnasium vector env or an EnvPool pool that autoresets on the next
    step, just reset to `observation`) with each sub-env's actions in order.

    The step after a sub-env's last one only resets it: it takes no action of that sub-env's
    sequence (any action is sent and ignored), records no transition, and must give no reward
    and no flags. Sub-envs that used up their actions keep stepping with their last one, and
    their results are dropped.

    Args:
        vector_env: the env; `step(actions)` returns `(obs, reward, terminated, truncated,
            info)` for every sub-env.
        observation: the observations of the reset, `[N, *obs]`.
        actions: the actions of each sub-env's transitions, `[N, T, *action]`.

    Returns:
        The transitions per field of `FIELDS`, each `[N, T, ...]`, as the loop produced them.

    Raises:
        AssertionError: when a reset-only step gives a reward or a flag.
    """
    num_envs, steps = actions.shape[:2]
    used = np.zeros(num_envs, dtype=np.int64)
    resetting = np.zeros(num_envs, dtype=np.bool_)
    records: dict[str, list[list[Any]]] = {name: [[] for _ in range(num_envs)] for name in FIELDS}
    while (used < steps).any():
        sent = actions[np.arange(num_envs), np.minimum(used, steps - 1)]
        next_observation, reward, terminated, truncated, _ = vector_env.step(sent)
        for env in range(num_envs):
            if resetting[env]:
                if reward[env] != 0 or terminated[env] or truncated[env]:
                    raise AssertionError(f"sub-env {env}: a reset-only step gave a reward or flag")
                resetting[env] = False
                continue
            if used[env] == steps:
                continue
            values = (
                observation[env],
                sent[env],
                next_observation[env],
                reward[env],
                terminated[env],
                truncated[env],
            )
            for name, value in zip(FIELDS, values, strict=True):
                records[name][env].append(np.array(value, copy=True))
            used[env] += 1
            resetting[env] = bool(terminated[env] or truncated[env])
        observation = np.array(next_observation, copy=True)
    return {
        name: np.stack([np.stack(rows) for rows in per_env]) for name, per_env in records.items()
    }


def assert_batch_matches_replay(data: TensorDictBase, replay: dict[str, np.ndarray]) -> int:
    """Check a batch `[N, T]` (root and `"next"` observations, rewards, flags, trajectory ids)
    against `replay_next_step_loop`'s transitions; returns the number of episode ends seen.

    Raises:
        AssertionError: naming the first field that differs.
    """
    pairs = {
        "observation": data[keys.OBSERVATION],
        "next_observation": data[keys.NEXT, keys.OBSERVATION],
        "reward": data[keys.NEXT, keys.REWARD].squeeze(-1),
        "terminated": data[keys.NEXT, keys.TERMINATED].squeeze(-1),
        "truncated": data[keys.NEXT, keys.TRUNCATED].squeeze(-1),
    }
    for name, ours in pairs.items():
        expected = replay[name].astype(ours.numpy().dtype)
        np.testing.assert_array_equal(ours.numpy(), expected, err_msg=f"field {name!r}")
    done = data[keys.NEXT, keys.DONE].squeeze(-1).numpy()
    np.testing.assert_array_equal(done, replay["terminated"] | replay["truncated"])
    if keys.TRAJ_IDS in data.keys(include_nested=True):
        # A trajectory id changes exactly after an episode end, never in between.
        changes = np.diff(data[keys.TRAJ_IDS].numpy(), axis=-1) != 0
        np.testing.assert_array_equal(changes, done[:, :-1], err_msg="trajectory ids")
    return int(done.sum())


def episode_returns(replay: dict[str, np.ndarray]) -> list[float]:
    """The returns of the episodes that end within `replay_next_step_loop`'s transitions."""
    returns = []
    done = replay["terminated"] | replay["truncated"]
    for rewards, ends in zip(replay["reward"], done, strict=True):
        start = 0
        for end in np.flatnonzero(ends):
            returns.append(float(rewards[start : end + 1].sum()))
            start = end + 1
    return returns

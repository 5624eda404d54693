"""Trajectory views (`VIEWS`), the counting env, a policy echoing them, and the expected values."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule

from rlcollect import ViewRequirement, keys
from rlcollect.testing import CountingEnv
from rlcollect.transforms import ObservationNorm, TransformedEnv

SHIFTS = {"minus_one": -1, "pair": [-2, -1], "range": "-3:-1"}
# Every shift of the issue on the observation, the action and the reward.
SOURCES = {"obs": keys.OBSERVATION, "action": keys.ACTION, "reward": keys.REWARD}
VIEWS = {
    f"{source}_{shift_name}": ViewRequirement(data_col, shift=shift)
    for source, data_col in SOURCES.items()
    for shift_name, shift in SHIFTS.items()
}
# Views that pick from a longer window: an int shift past -1, a gap, an order of their own.
VIEWS |= {
    "obs_three_back": ViewRequirement(keys.OBSERVATION, shift=-3),
    "action_gap": ViewRequirement(keys.ACTION, shift=[-3, -1]),
    "obs_reordered": ViewRequirement(keys.OBSERVATION, shift=[-1, -2, 0]),
}


def counting_env(episode_length: int | list[int] = 5, batch_size: tuple[int, ...] = ()) -> object:
    """The counting env with observations 10, 11, ... (an episode's first observation is not
    zero, so repeating it differs from zero padding)."""
    env = CountingEnv(episode_length=episode_length, batch_size=batch_size)
    return TransformedEnv(env, ObservationNorm(loc=10.0, scale=1.0))


def echo_views(observation: torch.Tensor, *views: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A policy that hands back what it read: action = (observation + 1) % 2, then the views."""
    action = (observation.squeeze(-1).long() + 1) % 2
    return (action, *(view.clone() for view in views))


def echo_policy(names: list[str]) -> TensorDictModule:
    """`echo_views` writing what it read under `seen_<view>`: a policy in another process
    reports its inputs in the batch."""
    return TensorDictModule(
        echo_views,
        in_keys=[keys.OBSERVATION, *names],
        out_keys=[keys.ACTION, *(f"seen_{name}" for name in names)],
    )


def expected_view(batch: TensorDictBase, data_col: str, shift: object) -> torch.Tensor:
    """The view, step by step: within each trajectory (starting at a reset, or at a new
    trajectory id: a soft horizon's cut), before its start the first observation (observation
    views) or zero."""
    offsets = [shift] if isinstance(shift, int) else list(shift)
    if isinstance(shift, str):
        start, stop = map(int, shift.split(":"))
        offsets = list(range(start, stop + 1))
    is_observation = data_col == keys.OBSERVATION
    source = batch[data_col] if data_col != keys.REWARD else batch[keys.NEXT, keys.REWARD]
    steps = batch.shape[-1]
    rows = source.reshape(-1, steps, *source.shape[batch.ndim :])
    done = batch[keys.NEXT, keys.DONE].reshape(-1, steps)
    ids = batch[keys.TRAJ_IDS].reshape(-1, steps)
    out = torch.zeros(rows.shape[0], steps, len(offsets), *rows.shape[2:], dtype=rows.dtype)
    for row in range(rows.shape[0]):
        episode_start = 0
        for t in range(steps):
            if t > 0 and (done[row, t - 1] or ids[row, t] != ids[row, t - 1]):
                episode_start = t
            for k, offset in enumerate(offsets):
                u = t + offset
                if u >= episode_start:
                    out[row, t, k] = rows[row, u]
                elif is_observation:
                    out[row, t, k] = rows[row, episode_start]
    out = out.reshape(*batch.shape, len(offsets), *rows.shape[2:])
    return out.squeeze(batch.ndim) if isinstance(shift, int) else out

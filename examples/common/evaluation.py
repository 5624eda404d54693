"""`evaluate`: the mean return of a policy acting greedily for whole episodes; `report_run`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict.nn import InteractionType, set_interaction_type

from rlcollect import keys


@torch.no_grad()
def evaluate(
    env_factory: Callable[[], Any], policy: Any, episodes: int, max_steps: int = 100_000
) -> float:
    """Run `policy` greedily (interaction type DETERMINISTIC) in a fresh env from
    `env_factory` until `episodes` episodes finish, and return their mean return.

    A batched env runs its sub-envs together; the first `episodes` episodes to finish count.
    Stops after `max_steps` batched steps (NaN if no episode finished).
    """
    env = env_factory()
    returns: list[float] = []
    try:
        root = env.reset()
        running = torch.zeros(max(1, int(torch.Size(env.batch_size).numel())), dtype=torch.float64)
        with set_interaction_type(InteractionType.DETERMINISTIC):
            for _ in range(max_steps):
                step, root = env.step_and_maybe_reset(policy(root))
                running += step.get((keys.NEXT, keys.REWARD)).reshape(-1).double()
                done = step.get((keys.NEXT, keys.DONE)).reshape(-1)
                returns.extend(running[done].tolist())
                running[done] = 0.0
                if len(returns) >= episodes:
                    break
    finally:
        env.close()
    finished = returns[:episodes]
    return sum(finished) / len(finished) if finished else float("nan")


def report_run(
    recorder: Any,
    env_factory: Callable[[], Any],
    policy: Any,
    episodes: int,
    columns: Sequence[str] = (),
) -> None:
    """Print a run's summary (its last metrics row, with `columns` of the script's own) and,
    when `episodes` > 0, the greedy evaluation of `policy` over that many episodes."""
    row = recorder.last_row
    fields = [
        f"frames={row.get('frames')}",
        f"wall_time_s={recorder.elapsed:.1f}",
        f"mean_episode_return={row.get('mean_episode_return', float('nan')):.1f}",
        *(f"{column}={row.get(column)}" for column in columns),
        f"run_dir={recorder.run_dir}",
    ]
    print(" ".join(fields))
    if episodes > 0:
        greedy = evaluate(env_factory, policy, episodes)
        print(f"greedy evaluation: mean return {greedy:.1f} over {episodes} episodes")

"""`evaluate`: the mean return of a policy acting greedily for whole episodes; `report_run`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict.nn import InteractionType, set_interaction_type

from rlcollect import keys

log = logging.getLogger(__name__)  # Hydra sends it to the console and the job log

EVAL_SEED_OFFSET = 1_000_003  # evaluation episodes start from states training never sees


@torch.no_grad()
def evaluate(
    env_factory: Callable[[], Any],
    policy: Any,
    episodes: int,
    seed: int | None = None,
    max_steps: int = 100_000,
    reward_key: Any = (keys.NEXT, keys.REWARD),
) -> float:
    """Run `policy` greedily (interaction type DETERMINISTIC) in a fresh env from
    `env_factory` until `episodes` episodes finish, and return their mean return.

    `policy=None` acts uniformly at random (drawn from torch's generator seeded with `seed`,
    so that a random baseline plays the same episodes as the policy it is compared with). A
    group's reward (`("next", group, "reward")`, one per agent) counts as its mean over the
    agents: the return per agent. A batched env's sub-envs each contribute their share
    (sub-env i its first `(episodes + i) // n` episodes, as SB3's `evaluate_policy`), so the
    short episodes that end first do not crowd out the long ones. With `seed`, the env is
    seeded first: the same policy then scores the same. Stops after `max_steps` batched steps
    (NaN if none finished).
    """
    env = env_factory()
    returns: list[float] = []
    try:
        if seed is not None:
            env.set_seed(seed)
        root = env.reset()
        n = max(1, int(torch.Size(env.batch_size).numel()))
        quota = torch.tensor([(episodes + i) // n for i in range(n)])
        counted = torch.zeros(n, dtype=torch.long)
        running = torch.zeros(n, dtype=torch.float64)
        act = policy if policy is not None else env.rand_action
        with torch.random.fork_rng(), set_interaction_type(InteractionType.DETERMINISTIC):
            torch.manual_seed(seed if seed is not None else 0)
            for _ in range(max_steps):
                step, root = env.step_and_maybe_reset(act(root))
                running += step.get(reward_key).double().reshape(n, -1).mean(-1)
                done = step.get((keys.NEXT, keys.DONE)).reshape(-1)
                wanted = done & (counted < quota)
                returns.extend(running[wanted].tolist())
                counted += wanted.long()
                running[done] = 0.0
                if bool((counted >= quota).all()):
                    break
    finally:
        env.close()
    return sum(returns) / len(returns) if returns else float("nan")


def report_run(
    recorder: Any,
    env_factory: Callable[[], Any],
    policy: Any,
    episodes: int,
    columns: Sequence[str] = (),
    seed: int | None = None,
) -> None:
    """Print a run's summary (its last metrics row, with `columns` of the script's own) and,
    when `episodes` > 0, the greedy evaluation of `policy` over that many episodes (seeded
    with `seed`)."""
    row = recorder.last_row
    fields = [
        f"frames={row.get('frames', recorder.frames)}",
        f"wall_time_s={recorder.elapsed:.1f}",
        f"mean_episode_return={row.get('mean_episode_return', float('nan')):.1f}",
        *(f"{column}={row.get(column)}" for column in columns),
        f"run_dir={recorder.run_dir}",
    ]
    log.info(" ".join(fields))
    if episodes > 0:
        greedy = evaluate(env_factory, policy, episodes, seed)
        log.info(f"greedy evaluation: mean return {greedy:.1f} over {episodes} episodes")
        recorder.record_final_evaluation(greedy)

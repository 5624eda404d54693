"""`evaluate`: the mean return of a policy acting greedily for whole episodes; `report_run`;
`BackgroundEvaluation`: the same greedy episodes during training, in the background."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict.nn import InteractionType, TensorDictModule, set_interaction_type

from rlcollect import keys
from rlcollect.collectors import Evaluator

log = logging.getLogger(__name__)  # Hydra sends it to the console and the job log

Weights = dict[str, torch.Tensor]
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


@dataclass
class EvaluationResult:
    """A finished background evaluation: the weights it played (a copy taken when it was
    started), the frame count then, and their mean greedy return."""

    frames: int
    mean_return: float
    weights: dict[str, torch.Tensor]


class BackgroundEvaluation:
    """Greedy evaluations of a training policy that run while training goes on.

    `start(frames)` copies the policy's weights and hands them to rlcollect's `Evaluator`,
    which plays `episodes` whole episodes in its own thread, with its own env and copy of the
    policy, every evaluation from the same first states (`seed`); `finished()` returns the
    evaluations done since the last call, each with the weights it played. An evaluation due
    while the previous one still runs is skipped (`busy_policy="skip"`), so evaluations never
    pile up behind training. Unlike `evaluate`, an evaluation counts the first `episodes`
    episodes to end, whichever sub-env they come from.

    Whether a policy explores is read from tensordict's interaction type, which is one setting
    for the whole process: an evaluation under DETERMINISTIC in a thread would make a
    collector stepping beside it greedy too, and itself explore whenever the collector sets
    RANDOM. So, with `greedy_weights` (weights -> the same weights acting greedily, e.g. with
    epsilon 0), evaluations run under the collectors' RANDOM type and are greedy by their
    weights; without it, pass `backend="process"` to run them in a worker process.
    """

    def __init__(
        self,
        env_factory: Callable[[], Any],
        policy: torch.nn.Module,
        in_keys: Sequence[Any],
        episodes: int,
        seed: int | None = None,
        greedy_weights: Callable[[Weights], Weights] | None = None,
        backend: str = "thread",
        out_keys: Sequence[Any] = (keys.ACTION,),
    ) -> None:
        self.policy = policy
        self.greedy_weights = greedy_weights
        if greedy_weights is None and backend == "thread":
            raise ValueError(
                "a background evaluation in a thread needs greedy_weights (see the class "
                "docstring); pass greedy_weights=..., or backend='process'."
            )
        template = copy.deepcopy(policy)
        self.evaluator = Evaluator(
            env_factory,
            policy_factory=lambda env: TensorDictModule(
                template, in_keys=list(in_keys), out_keys=list(out_keys)
            ),
            num_trajectories=episodes,
            seed=seed,
            busy_policy="skip",
            log_prefix="greedy",
            backend=backend,
            exploration_type=(
                InteractionType.RANDOM if greedy_weights else InteractionType.DETERMINISTIC
            ),
        )
        self._weights: dict[int, dict[str, torch.Tensor]] = {}

    def start(self, frames: int) -> bool:
        """Start evaluating the policy's current weights in the background (False: skipped,
        the previous evaluation still runs)."""
        weights = {name: t.detach().clone() for name, t in self.policy.state_dict().items()}
        played = self.greedy_weights(dict(weights)) if self.greedy_weights else weights
        started = self.evaluator.trigger_eval(played, step=frames)
        if started:
            self._weights[frames] = weights
        return started

    def finished(self, wait: bool = False) -> list[EvaluationResult]:
        """The evaluations finished since the last call, oldest first; with `wait`, the one
        still running too (waited for)."""
        results = []
        while True:
            result = self.evaluator.wait() if wait else self.evaluator.poll()
            if result is None:
                return results
            frames = int(result["greedy/step"])
            weights = self._weights.pop(frames)
            results.append(EvaluationResult(frames, float(result["greedy/reward"]), weights))

    def close(self) -> None:
        """Stop the evaluator and its worker (an evaluation in flight is given up)."""
        self.evaluator.shutdown()

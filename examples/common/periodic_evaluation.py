"""`PeriodicEvaluation`: greedy episodes of the learner's policy every `eval_every` frames, in
the background, keeping the best policy so far; the examples' periodic evaluation (DQN, PPO,
SAC)."""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from tensordict.nn import TensorDictModule
from torch import nn

from common.checkpoint import save_checkpoint
from common.config import build_partial
from common.evaluation import EVAL_SEED_OFFSET, BackgroundEvaluation, Weights, evaluate
from common.video import EvaluationVideo
from rlcollect import keys

log = logging.getLogger(__name__)

BEST_POLICY_NAME = "best_policy.pt"
EVAL_RETURN = "eval_return"  # the metrics column of the greedy return


class PeriodicEvaluation:
    """Greedy episodes of the learner's policy every `eval_every` frames (`eval_episodes` of
    them): the return a run is judged by, free of the exploration noise of training episodes.

    They run in the background (`BackgroundEvaluation`, rlcollect's `Evaluator`), so training
    does not pause for them: an evaluation started at a log row is reported in the row where it
    has finished, and its frame count is the one it started at. With `greedy_weights` (weights
    -> the same weights acting greedily, DQN's epsilon 0) the evaluator is a thread; without,
    a worker process that acts under tensordict's DETERMINISTIC interaction type (the mode of
    a stochastic actor), which a thread could not set without making the collector beside it
    greedy too. The best-scoring policy so far is written to `<run dir>/best_policy.pt` (as
    SB3's EvalCallback does): a run can unlearn a solved task late. With `video`, a greedy
    episode is recorded every `video.every` evaluations too (DQN's cadence; PPO and SAC record
    theirs by iteration or row).
    """

    def __init__(
        self,
        cfg: DictConfig,
        policy: nn.Module,
        in_keys: Sequence[Any],
        start_frames: int,
        run_dir: Path,
        video: EvaluationVideo | None = None,
        out_keys: Sequence[Any] = (keys.ACTION,),
        greedy_weights: Callable[[Weights], Weights] | None = None,
    ) -> None:
        self.every = cfg.eval_every
        self.video = video
        self.evaluations = 0
        self.episodes = cfg.eval_episodes
        self.env_factory = build_partial(cfg, "env.make")
        self.learner_policy = policy
        self.policy = TensorDictModule(policy, in_keys=list(in_keys), out_keys=list(out_keys))
        self.next_at = start_frames + self.every
        self.best_path = run_dir / BEST_POLICY_NAME
        self.best: dict[str, Any] | None = None  # what best_path holds: policy, frames, return
        # Every evaluation starts from the same states, so their returns compare policies.
        self.seed = cfg.seed + EVAL_SEED_OFFSET
        self.fresh_seed = self.seed + 100_000  # episodes no evaluation picked a policy on
        self.background = (
            BackgroundEvaluation(
                self.env_factory,
                policy,
                in_keys,
                self.episodes,
                self.seed,
                greedy_weights=greedy_weights,
                backend="thread" if greedy_weights else "process",
                out_keys=out_keys,
            )
            if self.every > 0 and self.episodes > 0
            else None
        )

    @property
    def best_return(self) -> float:
        """The greedy return of the best policy so far (-inf before the first evaluation)."""
        return -math.inf if self.best is None else float(self.best["eval_return"])

    def resume(self, saved_best: dict[str, Any] | None) -> None:
        """Take over the best policy of the run being resumed: the checkpoint's, or the one in
        the run dir when the run went on past its checkpoint and found a better one. The run
        dir's `best_policy.pt` then holds it, also when resuming into a new run dir."""
        on_disk = None
        if self.best_path.exists():
            on_disk = torch.load(self.best_path, map_location="cpu", weights_only=True)
        candidates = [best for best in (saved_best, on_disk) if best is not None]
        if not candidates:
            return
        self.best = max(candidates, key=lambda best: float(best["eval_return"]))
        if self.best is not on_disk:
            save_checkpoint(self.best_path, self.best)

    def run_if_due(self, frames: int) -> float:
        """Start a background evaluation when one is due at `frames`; the mean greedy return
        of the evaluation that finished since the last call (NaN when none did)."""
        if self.background is not None and frames >= self.next_at:
            self.next_at += self.every * ((frames - self.next_at) // self.every + 1)  # grid
            if self.background.start(frames):
                self.evaluations += 1
                if self.video is not None and self.video.due(self.evaluations):
                    self.video.record(self.policy, frames, self.seed)
        return self.collect()

    def collect(self, wait: bool = False) -> float:
        """Take the finished evaluations (with `wait`, the running one too), keep the best
        policy, and return the latest mean return (NaN when none finished)."""
        if self.background is None:
            return float("nan")
        mean = float("nan")
        for result in self.background.finished(wait):
            mean = result.mean_return
            if mean >= self.best_return:  # on a tie, keep the later (longer-trained) policy
                self.best = {
                    "policy": result.weights,
                    "frames": result.frames,
                    "eval_return": mean,
                }
                save_checkpoint(self.best_path, self.best)
        return mean

    def close(self) -> None:
        """Stop the background evaluations."""
        if self.background is not None:
            self.background.close()

    def finish(self, recorder: Any, stats: Mapping[str, Any], wait: bool = True) -> None:
        """At the end of training: take the evaluation still running (waited for with
        `wait`), write a metrics row with its return when one finished, and stop."""
        last = self.collect(wait)
        self.close()
        if not math.isnan(last):
            recorder.log(stats, **{EVAL_RETURN: last})

    def report_best(self) -> None:
        """Re-evaluate the saved best policy on fresh episodes and print the result."""
        if self.episodes <= 0 or not self.best_path.exists():
            return
        saved = torch.load(self.best_path, map_location="cpu", weights_only=True)
        best = copy.deepcopy(self.learner_policy)
        best.load_state_dict(saved["policy"])
        module = TensorDictModule(best, in_keys=self.policy.in_keys, out_keys=self.policy.out_keys)
        mean = evaluate(self.env_factory, module, self.episodes, self.fresh_seed)
        log.info(
            f"best policy ({saved['eval_return']:.1f} at {saved['frames']} frames, "
            f"{self.best_path}): mean return {mean:.1f} over {self.episodes} new episodes"
        )

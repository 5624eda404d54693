"""DQN with rlcollect: a background collector fills a replay buffer while the learner trains.

Run from the repository root:

    python examples/dqn.py                                   # CartPole-v1, 150k frames
    python examples/dqn.py env=cartpole_batched collector.frames_per_batch=64
    python examples/dqn.py resume=outputs/dqn/<run>/checkpoint.pt collector.total_frames=300000
    python examples/dqn.py collector=ray replay_buffer=ray   # Ray actors fill a RayReplayBuffer

`collector.start()` runs collection in a thread (epsilon-greedy on a copy of the Q-network, after
`init_random_frames` random ones); the learner keeps one gradient step per
`dqn.frames_per_update` frames, pausing collection when it falls behind, and pushes its weights
and the current epsilon with `update_policy_weights_`. The run directory receives metrics.csv,
return.png and checkpoint.pt (the replay buffer is not saved: a resumed run refills it).
"""

from __future__ import annotations

import copy
import logging
import math
import sys
from typing import Any

import hydra
import torch
from common.config import (
    ConfigError,
    build,
    build_partial,
    check_overrides,
    checkpoint_identity,
    collector_has_workers,
    refuse_collector_option,
    require_bool,
    resume_state,
    run_or_exit,
    served_by_ray,
    validate,
)
from common.env_info import EnvInfo, probe_env
from common.evaluation import report_run
from common.extras import check_extras
from common.interrupt import StopOnInterrupt
from common.models import EpsilonGreedy
from common.off_policy import StallWatch, UpdatePacer, next_row_at
from common.periodic_evaluation import PeriodicEvaluation
from common.recorder import WEIGHT_UPDATE, RunRecorder
from common.schedules import LinearLearningRate
from common.video import EvaluationVideo, check_video_config
from omegaconf import DictConfig, OmegaConf
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

from rlcollect import keys

log = logging.getLogger(__name__)  # Hydra sends it to the console and the job log

EXTRA_COLUMNS = ("loss", "epsilon", "lr", "updates", "buffer_size", "eval_return", WEIGHT_UPDATE)


class Learner:
    """Gradient steps on replay samples, target-network updates, and the update count."""

    def __init__(self, cfg: DictConfig, q_network: nn.Module, optimizer: Any, key: Any) -> None:
        self.cfg = cfg.dqn
        self.q_network = q_network
        self.target_network = copy.deepcopy(q_network).requires_grad_(False)
        self.optimizer = optimizer
        self.key = key
        self.lr_schedule = LinearLearningRate(optimizer, self.cfg.lr_end_factor)
        self.updates = 0
        self.loss_sum = 0.0
        self.loss_count = 0

    def loss(self, batch: TensorDictBase) -> torch.Tensor:
        """The TD loss (Huber) of one batch, with a double-DQN target when configured."""
        observation, next_observation = batch.get(self.key), batch.get((keys.NEXT, self.key))
        action = batch.get(keys.ACTION).long().unsqueeze(-1)
        q_value = self.q_network(observation).gather(-1, action).squeeze(-1)
        with torch.no_grad():
            next_q = self.target_network(next_observation)
            if self.cfg.double_dqn:
                best = self.q_network(next_observation).argmax(-1, keepdim=True)
                next_value = next_q.gather(-1, best).squeeze(-1)
            else:
                next_value = next_q.max(-1).values
            reward = batch.get((keys.NEXT, keys.REWARD)).squeeze(-1)
            alive = (~batch.get((keys.NEXT, keys.TERMINATED))).squeeze(-1).float()
            target = reward + self.cfg.gamma * alive * next_value
        return nn.functional.smooth_l1_loss(q_value, target)

    def run(self, steps: int, replay_buffer: Any) -> None:
        """Take `steps` gradient steps on fresh samples of `replay_buffer`."""
        for _ in range(steps):
            loss = self.loss(replay_buffer.sample())
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(self.q_network.parameters(), self.cfg.max_grad_norm)
            self.optimizer.step()
            self.updates += 1
            self.loss_sum += loss.item()
            self.loss_count += 1
            if self.updates % self.cfg.target_update_every == 0:
                self.update_target()

    def anneal_learning_rate(self, frames: int, total_frames: int) -> float:
        """Decay the learning rate linearly to `lr_end_factor` times its configured value over
        the run; a small late learning rate keeps a Q-network that solved the task from
        unlearning it."""
        return self.lr_schedule.set(frames / max(total_frames, 1))

    @torch.no_grad()
    def update_target(self) -> None:
        """Move the target network towards the online one (`tau` = 1: copy it)."""
        for target, online in zip(
            self.target_network.parameters(), self.q_network.parameters(), strict=True
        ):
            target.lerp_(online, self.cfg.tau)

    def mean_loss(self) -> float:
        """The mean loss since the last call (NaN when no step was taken)."""
        mean = self.loss_sum / self.loss_count if self.loss_count else float("nan")
        self.loss_sum, self.loss_count = 0.0, 0
        return mean


def epsilon_at(frames: int, cfg: DictConfig, total_frames: int) -> float:
    """Epsilon decays linearly from `start_epsilon` to `end_epsilon` over the first
    `exploration_fraction` of the run's frames."""
    span = max(1.0, cfg.dqn.exploration_fraction * max(total_frames, 1))
    progress = min(1.0, frames / span)
    return cfg.dqn.start_epsilon + progress * (cfg.dqn.end_epsilon - cfg.dqn.start_epsilon)


def check_config(cfg: DictConfig) -> None:
    """Stop before any work when the config is wrong, naming the key."""
    validate(
        cfg,
        targets=["env.make", "collector", "replay_buffer", "q_network", "optim", "logger"],
        positive_ints=[
            "dqn.frames_per_update",
            "dqn.target_update_every",
            "dqn.sync_every",
            "dqn.max_lag_updates",
            "log_every",
            "torch_threads",
        ],
        fractions=[
            "dqn.gamma",
            "dqn.tau",
            "dqn.start_epsilon",
            "dqn.end_epsilon",
            "dqn.lr_end_factor",
            "dqn.exploration_fraction",
        ],
        nonnegative_ints=["eval_episodes", "eval_every", "dqn.learning_starts"],
        positive_numbers=["dqn.max_grad_norm", "dqn.stall_timeout_s"],
    )
    require_bool(cfg, "dqn.background")
    check_video_config(cfg)
    refuse_collector_option(
        cfg,
        "collector.split_trajs",
        "the replay buffer would store the padding of split trajectories as transitions. "
        "Leave collector.split_trajs=false.",
    )
    if served_by_ray(cfg, "collector") and not served_by_ray(cfg, "replay_buffer"):
        raise ConfigError(
            f"replay_buffer: {cfg.replay_buffer._target_} lives in this process, where the "
            "collector's Ray actors cannot write; with collector=ray add replay_buffer=ray."
        )
    capacity = OmegaConf.select(cfg, "replay_buffer.storage.max_size", default=None)
    if isinstance(capacity, int) and cfg.dqn.learning_starts > capacity:
        raise ConfigError(
            f"dqn.learning_starts={cfg.dqn.learning_starts} is more than the buffer holds "
            f"(replay_buffer.storage.max_size={capacity}): learning would never start. Lower "
            "one or raise the other."
        )
    if cfg.collector.total_frames <= 0:
        raise ConfigError(
            f"collector.total_frames={cfg.collector.total_frames}: DQN needs a finite run, "
            "e.g. collector.total_frames=150000."
        )


def require_discrete(cfg: DictConfig, info: EnvInfo) -> None:
    """DQN picks actions by argmax over Q-values: the env's actions must be discrete."""
    if not info.is_discrete:
        raise ConfigError(
            f"env.id={cfg.env.id!r} has continuous actions; DQN needs a discrete action space "
            "(e.g. env=cartpole). Use examples/ppo.py for continuous control."
        )


def train(cfg: DictConfig) -> None:
    # --- set-up: everything from the config, checked before any work ---
    check_config(cfg)
    state: dict[str, Any] = resume_state(
        cfg, "dqn", ("policy", "target_network", "optimizer", "collector")
    )
    torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    env_factory = build_partial(cfg, "env.make")
    info = probe_env(env_factory)
    require_discrete(cfg, info)
    key = info.observation_key
    q_network = build(cfg, "q_network", info=info)
    policy = EpsilonGreedy(q_network, cfg.dqn.start_epsilon)
    optimizer = build(cfg, "optim", params=q_network.parameters())
    learner = Learner(cfg, q_network, optimizer, key)
    # Collector workers write the buffer themselves: it must be in shared memory then (a
    # buffer served by Ray is reached from any process).
    local_buffer = not served_by_ray(cfg, "replay_buffer")
    shared = {"shared": True} if collector_has_workers(cfg) and local_buffer else {}
    replay_buffer = build(cfg, "replay_buffer", **shared)
    # The collector acts with its own copy; the learner pushes weights and epsilon to it.
    collector_policy = TensorDictModule(
        copy.deepcopy(policy), in_keys=[key], out_keys=[keys.ACTION]
    )
    collector = build(
        cfg,
        "collector",
        create_env_fn=env_factory,
        policy=collector_policy,
        replay_buffer=replay_buffer,
    )
    collector.set_seed(cfg.seed)

    if state:
        policy.load_state_dict(state["policy"])
        learner.target_network.load_state_dict(state["target_network"])
        optimizer.load_state_dict(state["optimizer"])
        learner.updates = int(state["updates"])
        collector.load_state_dict(state["collector"])
        factor = learner.lr_schedule.continue_from(collector.frames / collector.total_frames)
        log.info(
            f"resumed at {collector.frames} frames: the learning rate goes on from "
            f"{factor:.3g}x optim.lr to {cfg.dqn.lr_end_factor}x at {collector.total_frames}"
        )

    recorder = RunRecorder.for_run(
        cfg, collector, state, f"DQN {cfg.env.id}", extra_columns=EXTRA_COLUMNS
    )

    video = EvaluationVideo(cfg, recorder.run_dir, recorder.logger)
    evaluation = PeriodicEvaluation(
        cfg, policy, [key], collector.frames, recorder.run_dir, video,
        greedy_weights=without_exploration,
    )  # fmt: skip
    if state:
        evaluation.resume(state.get("best_policy"))

    def checkpoint() -> dict[str, Any]:
        return {
            **checkpoint_identity(cfg, "dqn"),
            "best_eval_return": evaluation.best_return,
            "best_policy": evaluation.best,
            "frames": collector.frames,
            "collector": collector.state_dict(),
            "policy": policy.state_dict(),
            "target_network": learner.target_network.state_dict(),
            "optimizer": optimizer.state_dict(),
            "updates": learner.updates,
        }

    # --- collect in the background, learn in the foreground ---
    if cfg.dqn.background:
        collector.start()
    with StopOnInterrupt() as stop:
        try:
            learn(
                cfg,
                collector,
                replay_buffer,
                learner,
                policy,
                recorder,
                evaluation,
                checkpoint,
                stop,
            )
        finally:
            collector.async_shutdown()
            evaluation.close()
    recorder.save(collector.frames, checkpoint)
    recorder.close()
    if not stop.requested:
        greedy_policy = TensorDictModule(policy, in_keys=[key], out_keys=[keys.ACTION])
        report_run(
            recorder,
            env_factory,
            greedy_policy,
            cfg.eval_episodes,
            columns=["updates"],
            seed=evaluation.fresh_seed,  # other episodes than those the best policy was picked on
        )
        video.record(greedy_policy, collector.frames, evaluation.fresh_seed, final=True)
        evaluation.report_best()
    recorder.finish()
    stop.exit_if_requested(recorder.run_dir)


def learn(
    cfg: DictConfig,
    collector: Any,
    replay_buffer: Any,
    learner: Learner,
    policy: EpsilonGreedy,
    recorder: RunRecorder,
    evaluation: PeriodicEvaluation,
    checkpoint: Any,
    stop: StopOnInterrupt,
) -> None:
    """The learner loop: keep pace with collection, push weights, evaluate, log, checkpoint;
    until the collector is done or `stop` is requested (Ctrl-C)."""
    pacer = UpdatePacer(1 / cfg.dqn.frames_per_update, cfg.dqn.learning_starts)
    watch = StallWatch(collector, cfg.dqn.stall_timeout_s)
    next_log = next_row_at(collector.frames, cfg.log_every)
    synced_at = learner.updates
    while not stop.requested:
        # Read "done" before the frame count: once done, `frames` is final and the learner
        # owes exactly the steps for it. The buffer's size is read before the frame count too,
        # and both before a pause (after one, the collector may add a batch at once): a batch
        # seen in the size but not in the count would anchor the pacer a batch early.
        finished = collector.is_done
        buffer_size = len(replay_buffer)
        frames = collector.frames
        if frames >= next_log:
            # Paused while evaluating and logging, so the row, the evaluation and the best
            # policy's message all name the same frame count.
            # The batch in flight may land before the pause holds: the grid steps past the
            # count the row names, so the next check cannot log that count's cell again.
            with collector.pause():
                logged = collector.frames
                eval_return = evaluation.run_if_due(logged)
                log_row(collector, replay_buffer, learner, policy, recorder, eval_return)
            # On the log_every grid (a late row does not push the next ones later).
            next_log += cfg.log_every * ((logged - next_log) // cfg.log_every + 1)
        if recorder.checkpoint_due(frames):
            with collector.pause():
                recorder.save(collector.frames, checkpoint)
        lag = pacer.lag(frames, learner.updates, buffer_size)
        if lag <= 0:
            if finished:
                break
            if cfg.dqn.background:
                watch.wait(frames)  # the collector's thread brings the frames
            else:
                collector.next()  # one batch into the buffer, now: a repeatable order
            continue
        learner.anneal_learning_rate(frames, collector.total_frames)
        if lag > cfg.dqn.max_lag_updates:
            with collector.pause():
                learner.run(lag, replay_buffer)
        else:
            learner.run(lag, replay_buffer)
        if learner.updates - synced_at >= cfg.dqn.sync_every:
            # Pushed while the collector runs: a step that reads half-copied weights is harmless,
            # and pausing would stall the learner for a whole batch.
            policy.epsilon.fill_(epsilon_at(collector.frames, cfg, collector.total_frames))
            with recorder.timed(WEIGHT_UPDATE):
                collector.update_policy_weights_(policy)
            synced_at = learner.updates
    last_eval = evaluation.collect(wait=not stop.requested)  # the one still running
    last = recorder.last_row
    if (last.get("frames"), last.get("updates")) != (collector.frames, learner.updates) or (
        not math.isnan(last_eval)
    ):
        log_row(collector, replay_buffer, learner, policy, recorder, last_eval)


def without_exploration(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`EpsilonGreedy`'s weights with epsilon 0: greedy whatever the interaction type."""
    return {**weights, "epsilon": torch.zeros_like(weights["epsilon"])}


def log_row(
    collector: Any,
    replay_buffer: Any,
    learner: Learner,
    policy: EpsilonGreedy,
    recorder: RunRecorder,
    eval_return: float = float("nan"),
) -> None:
    """Write one metrics row from the collector's stats and the learner's state."""
    recorder.log(
        collector.stats(),
        loss=learner.mean_loss(),
        epsilon=float(policy.epsilon),
        lr=learner.optimizer.param_groups[0]["lr"],
        updates=learner.updates,
        buffer_size=len(replay_buffer),
        eval_return=eval_return,
    )


@hydra.main(config_path="conf", config_name="dqn", version_base=None)
def main(cfg: DictConfig) -> None:
    run_or_exit(train, cfg)


if __name__ == "__main__":
    check_overrides("dqn", sys.argv[1:])
    check_extras("dqn", sys.argv[1:])
    main()

"""SAC with rlcollect: a background collector fills a replay buffer while the learner trains.

Run from the repository root:

    python examples/sac.py                                  # Pendulum-v1, 12k frames
    python examples/sac.py sac.utd_ratio=2 optim.lr=3e-4    # two gradient steps per frame
    python examples/sac.py resume=outputs/sac/<run>/checkpoint.pt collector.total_frames=30000
    python examples/sac.py logger=tensorboard video.enabled=true   # + event files, a video

`collector.start()` runs collection in a thread (uniformly random actions for the first
`collector.init_random_frames`, then the squashed-Gaussian policy on a copy of the actor); the
learner keeps `sac.utd_ratio` gradient steps per collected frame and pushes the actor's
weights with `update_policy_weights_`; a throttle (the collector's `pre_collect_hook`) keeps
collection at most `sac.collect_ahead` frames ahead of the learner. At the default (one
batch) the two take turns, so `seed=` repeats a run exactly. Pendulum counts as
solved when the mean return of the last 10 training episodes (`mean_return_last_10`) reaches
-200. The run directory receives config.yaml (resolved), metrics.csv, return.png and
checkpoint.pt (the replay buffer is not saved: a resumed run refills it); with a logger, its
files; with video.enabled, videos/*.mp4. Ctrl-C stops the run after the current gradient
steps, checkpoint and metrics written.
"""

from __future__ import annotations

import copy
import logging
import math
import sys
from dataclasses import dataclass, field
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
    resume_state,
    run_or_exit,
    served_by_ray,
    validate,
)
from common.env_info import probe_env
from common.evaluation import EVAL_SEED_OFFSET, report_run
from common.extras import check_extras
from common.interrupt import StopOnInterrupt
from common.off_policy import (
    CollectionThrottle,
    RecentReturns,
    StallWatch,
    UpdatePacer,
    next_row_at,
)
from common.periodic_evaluation import EVAL_RETURN, PeriodicEvaluation
from common.recorder import WEIGHT_UPDATE, RunRecorder
from common.video import EvaluationVideo, check_video_config
from omegaconf import DictConfig, OmegaConf
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

from rlcollect import keys

log = logging.getLogger(__name__)  # Hydra sends it to the console and the job log

RECENT_RETURN = "mean_return_last_10"
SOLVED_RETURN = -200.0  # Pendulum-v1 counts as solved at this mean of the last 10 episodes
EXTRA_COLUMNS = (
    RECENT_RETURN,
    "loss_critic",
    "loss_actor",
    "alpha",
    "entropy",
    "lr",
    "updates",
    "buffer_size",
    EVAL_RETURN,
    WEIGHT_UPDATE,
)
STATE_ENTRIES = ("actor", "critic", "target_critic", "log_alpha", "optimizer", "collector")


@dataclass
class Losses:
    """Sums of the loss parts since the last metrics row."""

    sums: dict[str, float] = field(default_factory=dict)
    count: int = 0

    def add(self, parts: dict[str, torch.Tensor]) -> None:
        for name, value in parts.items():
            self.sums[name] = self.sums.get(name, 0.0) + float(value)
        self.count += 1

    def means(self) -> dict[str, float]:
        """The mean of each part since the last call (NaN when no step was taken)."""
        means = {name: total / self.count for name, total in self.sums.items()}
        self.sums, self.count = {}, 0
        return means or dict.fromkeys(("loss_critic", "loss_actor", "entropy"), math.nan)


class Learner:
    """SAC's gradient steps: twin soft-Q regression on a Polyak-averaged target, the actor's
    reparameterised loss, and the entropy temperature tuned towards `target_entropy`.

    The three losses touch disjoint parameters (the actor's loss reads the critics with their
    parameters frozen), so one backward pass of their sum and one optimiser step over all the
    parameters (TorchRL's SAC example does the same) give each its own gradient: on small
    networks this saves a third of the time of three separate steps.
    """

    def __init__(self, cfg: DictConfig, actor: nn.Module, critic: nn.Module, key: Any) -> None:
        self.cfg = cfg.sac
        self.actor, self.critic, self.key = actor, critic, key
        self.target_critic = copy.deepcopy(critic).requires_grad_(False)
        # The learner's own noise: the collector's thread draws from torch's global generator.
        self.generator = torch.Generator().manual_seed(cfg.seed + 1)
        self.log_alpha = torch.tensor(math.log(self.cfg.init_alpha), requires_grad=True)
        parameters = [*actor.parameters(), *critic.parameters(), self.log_alpha]
        self.optimizer = build(cfg, "optim", params=parameters)
        action_dim = actor.action_scale.numel()
        target = self.cfg.target_entropy
        self.target_entropy = float(-action_dim if target is None else target)
        self.updates = 0
        self.losses = Losses()

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.detach().exp())

    def critic_loss(self, batch: TensorDictBase, alpha: torch.Tensor) -> torch.Tensor:
        """The soft Bellman error of both Q-networks (terminated steps do not bootstrap)."""
        next_observation = batch.get((keys.NEXT, self.key))
        with torch.no_grad():
            next_action, next_log_prob = self.actor.sample(next_observation, self.generator)
            next_q = torch.min(*self.target_critic(next_observation, next_action))
            soft_value = next_q.squeeze(-1) - alpha * next_log_prob
            reward = batch.get((keys.NEXT, keys.REWARD)).reshape(soft_value.shape)
            alive = (~batch.get((keys.NEXT, keys.TERMINATED))).reshape(soft_value.shape)
            target = reward + self.cfg.gamma * alive.float() * soft_value
        q1, q2 = self.critic(batch.get(self.key), batch.get(keys.ACTION))
        return 0.5 * ((q1.squeeze(-1) - target).pow(2) + (q2.squeeze(-1) - target).pow(2)).mean()

    def step(self, batch: TensorDictBase) -> None:
        """One gradient step of the critics, the actor and the temperature on `batch`."""
        alpha = self.log_alpha.exp().detach()
        loss_critic = self.critic_loss(batch, alpha)

        observation = batch.get(self.key)
        action, log_prob = self.actor.sample(observation, self.generator)
        self.critic.requires_grad_(False)  # the actor's loss moves the actor only
        q = torch.min(*self.critic(observation, action)).squeeze(-1)
        self.critic.requires_grad_(True)
        loss_actor = (alpha * log_prob - q).mean()
        loss_alpha = -self.log_alpha * (log_prob.detach() + self.target_entropy).mean()

        self.optimizer.zero_grad(set_to_none=True)
        (loss_critic + loss_actor + loss_alpha).backward()
        self.optimizer.step()
        with torch.no_grad():  # Polyak averaging of the target critics
            for target, online in zip(
                self.target_critic.parameters(), self.critic.parameters(), strict=True
            ):
                target.lerp_(online, self.cfg.tau)
        self.updates += 1
        self.losses.add(
            {
                "loss_critic": loss_critic.detach(),
                "loss_actor": loss_actor.detach(),
                "entropy": -log_prob.detach().mean(),
            }
        )

    def run(self, steps: int, replay_buffer: Any) -> None:
        """Take `steps` gradient steps on fresh samples of `replay_buffer`."""
        for _ in range(steps):
            self.step(replay_buffer.sample())

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds of the learner."""
        return {
            "actor": self.actor.state_dict(),
            "critic": self.critic.state_dict(),
            "target_critic": self.target_critic.state_dict(),
            "log_alpha": self.log_alpha.detach().clone(),
            "optimizer": self.optimizer.state_dict(),
            "updates": self.updates,
            "noise_generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take over the learner of a checkpoint."""
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.target_critic.load_state_dict(state["target_critic"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
        self.generator.set_state(state["noise_generator"])


def check_config(cfg: DictConfig) -> None:
    """Stop before any work when the config is wrong, naming the key."""
    validate(
        cfg,
        targets=["env.make", "collector", "replay_buffer", "actor", "critic", "optim", "logger"],
        positive_ints=[
            "sac.sync_every",
            "sac.collect_ahead",
            "sac.return_window",
            "log_every",
            "torch_threads",
        ],
        fractions=["sac.gamma", "sac.tau"],
        nonnegative_ints=["eval_episodes", "eval_every", "sac.learning_starts"],
        positive_numbers=["sac.utd_ratio", "sac.init_alpha", "sac.stall_timeout_s"],
    )
    check_video_config(cfg)
    refuse_collector_option(
        cfg,
        "collector.split_trajs",
        "the replay buffer would store the padding of split trajectories as transitions. "
        "Leave collector.split_trajs=false.",
    )
    if collector_has_workers(cfg) or served_by_ray(cfg, "collector"):
        raise ConfigError(
            f"collector: {cfg.collector._target_} collects in other processes; sac.py counts "
            "the last 10 episodes with a hook in this process. Use collector=single."
        )
    capacity = OmegaConf.select(cfg, "replay_buffer.storage.max_size", default=None)
    if isinstance(capacity, int) and cfg.sac.learning_starts > capacity:
        raise ConfigError(
            f"sac.learning_starts={cfg.sac.learning_starts} is more than the buffer holds "
            f"(replay_buffer.storage.max_size={capacity}): learning would never start. Lower "
            "one or raise the other."
        )
    if cfg.collector.total_frames <= 0:
        raise ConfigError(
            f"collector.total_frames={cfg.collector.total_frames}: SAC needs a finite run, "
            "e.g. collector.total_frames=15000."
        )


def build_actor_and_critic(cfg: DictConfig, info: Any) -> tuple[nn.Module, nn.Module]:
    """The networks of the config; an env SAC cannot act in is reported against `env.id`."""
    if info.is_discrete or info.action_low is None:
        raise ConfigError(
            f"env.id={cfg.env.id!r}: SAC squashes actions into a bounded Box action space; "
            "this env's are not (use env=pendulum, or examples/dqn.py for discrete actions)."
        )
    return build(cfg, "actor", info=info), build(cfg, "critic", info=info)


def train(cfg: DictConfig) -> float:
    """Train SAC as `cfg` says; returns the mean return of the last 10 training episodes."""
    # --- set-up: everything from the config, checked before any work ---
    check_config(cfg)
    state: dict[str, Any] = resume_state(cfg, "sac", STATE_ENTRIES)
    torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    env_factory = build_partial(cfg, "env.make")
    info = probe_env(env_factory)
    key = info.observation_key
    actor, critic = build_actor_and_critic(cfg, info)
    learner = Learner(cfg, actor, critic, key)
    # Its own generator for the sampler too, apart from the collector's thread.
    sampling = {} if served_by_ray(cfg, "replay_buffer") else {"generator": torch.Generator()}
    if sampling:
        sampling["generator"].manual_seed(cfg.seed + 2)
    replay_buffer = build(cfg, "replay_buffer", **sampling)
    recent = RecentReturns(cfg.sac.return_window)
    throttle = CollectionThrottle(cfg.sac.collect_ahead)
    # The collector acts with its own copy of the actor; the learner pushes weights to it.
    collector_policy = TensorDictModule(copy.deepcopy(actor), in_keys=[key], out_keys=[keys.ACTION])
    collector = build(
        cfg,
        "collector",
        create_env_fn=env_factory,
        policy=collector_policy,
        replay_buffer=replay_buffer,
        pre_collect_hook=throttle,
        post_collect_hook=recent,
    )
    throttle.watch(collector, replay_buffer)
    collector.set_seed(cfg.seed)
    if state:
        learner.load_state_dict(state)
        collector.load_state_dict(state["collector"])
        collector.update_policy_weights_(actor)
        log.info(f"resumed at {collector.frames} frames, {learner.updates} updates")

    recorder = RunRecorder.for_run(
        cfg, collector, state, f"SAC {cfg.env.id}", extra_columns=EXTRA_COLUMNS
    )

    def checkpoint() -> dict[str, Any]:
        return {
            **checkpoint_identity(cfg, "sac"),
            **learner.state_dict(),
            "frames": collector.frames,
            "collector": collector.state_dict(),
            "best_policy": evaluation.best,
        }

    video = EvaluationVideo(cfg, recorder.run_dir, recorder.logger)
    greedy = TensorDictModule(actor, in_keys=[key], out_keys=[keys.ACTION])
    eval_seed = cfg.seed + EVAL_SEED_OFFSET
    # Greedy episodes every eval_every frames, in a worker process (the actor's mode).
    evaluation = PeriodicEvaluation(cfg, actor, [key], collector.frames, recorder.run_dir)
    if state:
        evaluation.resume(state.get("best_policy"))

    # --- collect in the background, learn in the foreground ---
    collector.start()
    with StopOnInterrupt() as stop:  # Ctrl-C: leave the loop, save, exit
        try:
            parts = (replay_buffer, throttle, recent)
            reporting = (video, greedy, evaluation)
            learn(cfg, collector, parts, learner, recorder, checkpoint, stop, reporting)
        finally:
            throttle.open()
            collector.async_shutdown()
    # After the shutdown: the last batch is in the buffer and counted by `recent` now.
    last = recorder.last_row
    if (last.get("frames"), last.get("updates")) != (collector.frames, learner.updates):
        log_row(collector, replay_buffer, learner, recent, recorder)
    evaluation.finish(recorder, collector.stats(), wait=not stop.requested)
    recorder.save(collector.frames, checkpoint)
    recorder.close()
    if not stop.requested:
        report_run(recorder, env_factory, greedy, cfg.eval_episodes, ["updates"], eval_seed)
        video.record(greedy, collector.frames, eval_seed, final=True)
        evaluation.report_best()
    recorder.finish()
    stop.exit_if_requested(recorder.run_dir)
    return float(recorder.last_row.get(RECENT_RETURN, math.nan))


def learn(
    cfg: DictConfig,
    collector: Any,
    data: tuple[Any, CollectionThrottle, RecentReturns],
    learner: Learner,
    recorder: RunRecorder,
    checkpoint: Any,
    stop: StopOnInterrupt,
    reporting: tuple[EvaluationVideo, Any, PeriodicEvaluation],
) -> None:
    """The learner loop: keep pace with collection (and it with the learner), push weights,
    log (starting a background greedy evaluation when one is due), checkpoint, record a video
    of the greedy policy every `video.every` rows; until the collector is done or `stop` is
    requested (Ctrl-C). `data` is the replay buffer and the collector's two hooks; `reporting`
    the video, the greedy policy and the periodic evaluation."""
    replay_buffer, throttle, recent = data
    video, greedy, evaluation = reporting
    pacer = UpdatePacer(cfg.sac.utd_ratio, cfg.sac.learning_starts)
    watch = StallWatch(collector, cfg.sac.stall_timeout_s)
    next_log = next_row_at(collector.frames, cfg.log_every)
    synced_at = learner.updates
    rows = 0
    while not stop.requested:
        frames, buffer_size, finished = stored(collector, replay_buffer, throttle)
        if frames >= next_log:
            eval_return = evaluation.run_if_due(frames)
            log_row(collector, replay_buffer, learner, recent, recorder, eval_return)
            next_log += cfg.log_every * ((frames - next_log) // cfg.log_every + 1)  # on the grid
            rows += 1
            if video.due(rows, last=finished):
                video.record(greedy, frames, cfg.seed + EVAL_SEED_OFFSET)
        if recorder.checkpoint_due(frames):
            with throttle.opened(), collector.pause():  # the batch in flight may be held
                recorder.save(collector.frames, checkpoint)
                throttle.allow(frames)  # once resumed, the collector waits for its turn again
        lag = pacer.lag(frames, learner.updates, buffer_size)
        if lag <= 0:
            throttle.allow(frames)
            if finished:
                break
            watch.wait(frames)
            continue
        learner.run(lag, replay_buffer)
        if learner.updates - synced_at >= cfg.sac.sync_every:
            with recorder.timed(WEIGHT_UPDATE):
                collector.update_policy_weights_(learner.actor)
            synced_at = learner.updates
        throttle.allow(frames)  # trained on them, weights pushed: the collector may go on


def stored(
    collector: Any, replay_buffer: Any, throttle: CollectionThrottle
) -> tuple[int, int, bool]:
    """The frames written to the replay buffer, its size, and whether collection is done.
    The collector counts a batch before it writes it: the learner paces itself on what is
    written, the two read together between batches (so the same seed makes the same run)."""
    if not collector.is_done:
        return (*throttle.stored, False)
    with collector.pause():  # the last batch is written once the thread lets go
        return collector.frames, len(replay_buffer), True


def log_row(
    collector: Any,
    replay_buffer: Any,
    learner: Learner,
    recent: RecentReturns,
    recorder: RunRecorder,
    eval_return: float = math.nan,
) -> None:
    """Write one metrics row from the collector's stats and the learner's state (and the
    greedy return of a background evaluation that finished since the last row)."""
    recorder.log(
        collector.stats(),
        **{RECENT_RETURN: recent.mean()},
        **learner.losses.means(),
        alpha=learner.alpha,
        lr=learner.optimizer.param_groups[0]["lr"],
        updates=learner.updates,
        buffer_size=len(replay_buffer),
        eval_return=eval_return,
    )


@hydra.main(config_path="conf", config_name="sac", version_base=None)
def main(cfg: DictConfig) -> float:
    return run_or_exit(train, cfg)


if __name__ == "__main__":
    check_overrides("sac", sys.argv[1:])
    check_extras("sac", sys.argv[1:])
    main()

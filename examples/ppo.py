"""PPO with rlcollect: `for data in collector`, GAE, shuffled minibatch epochs, weight pushes.

Run from the repository root:

    python examples/ppo.py                                  # CartPole-v1, 8 envs, 122,880 frames
    python examples/ppo.py env=pendulum_batched collector.total_frames=1000000
    python examples/ppo.py resume=outputs/ppo/<run>/checkpoint.pt collector.total_frames=400000
    python examples/ppo.py --multirun +sweep=ppo_optuna   # Optuna: learning rate, clip range
    python examples/ppo.py logger=tensorboard video.enabled=true   # + event files, a video

The run directory (Hydra's output dir) receives config.yaml (resolved), metrics.csv, return.png
and checkpoint.pt; with a logger, its files (tensorboard/, wandb/, mlruns/); with video.enabled,
videos/*.mp4. Ctrl-C stops the run after the current batch, checkpoint and metrics written.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any

import hydra
import torch
from common.config import (
    ConfigError,
    build,
    build_partial,
    check_overrides,
    checkpoint_identity,
    refuse_collector_option,
    resume_state,
    run_or_exit,
    validate,
)
from common.env_info import probe_env
from common.evaluation import EVAL_SEED_OFFSET, report_run
from common.extras import check_extras
from common.interrupt import StopOnInterrupt
from common.metrics import WINDOW_RETURN
from common.periodic_evaluation import EVAL_RETURN, PeriodicEvaluation
from common.recorder import WEIGHT_UPDATE, RunRecorder
from common.schedules import LinearLearningRate
from common.video import EvaluationVideo, check_video_config
from omegaconf import DictConfig
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

from rlcollect import keys
from rlcollect.replay import RolloutBuffer

log = logging.getLogger(__name__)  # Hydra sends it to the console and the job log

LOSS_INPUTS = (keys.ACTION, keys.SAMPLE_LOG_PROB, keys.ADVANTAGE, keys.VALUE_TARGET)
LOSS_COLUMNS = ("loss_policy", "loss_value", "entropy", "clip_fraction", "lr", "clip_epsilon")


@dataclass(frozen=True)
class LossSettings:
    """The coefficients of the PPO loss, read from `cfg.ppo` once per batch: an OmegaConf
    lookup costs about 20 us, a noticeable share of a small MLP's minibatch step."""

    clip_epsilon: float
    entropy_coef: float
    value_coef: float
    normalize_advantage: bool

    @classmethod
    def from_config(cls, cfg: DictConfig, clip_factor: float = 1.0) -> LossSettings:
        """The settings of `cfg.ppo`, with the clip range scaled by `clip_factor`."""
        return cls(
            clip_epsilon=float(cfg.ppo.clip_epsilon) * clip_factor,
            entropy_coef=float(cfg.ppo.entropy_coef),
            value_coef=float(cfg.ppo.value_coef),
            normalize_advantage=bool(cfg.ppo.normalize_advantage),
        )


def ppo_loss(
    actor: nn.Module, critic: nn.Module, batch: TensorDictBase, key: Any, settings: LossSettings
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped-surrogate PPO loss of one minibatch, and its parts for logging."""
    observation = batch.get(key)
    log_prob, entropy = actor.evaluate(observation, batch.get(keys.ACTION))
    advantage = batch.get(keys.ADVANTAGE).squeeze(-1)
    if settings.normalize_advantage and advantage.numel() > 1:
        advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
    ratio = (log_prob - batch.get(keys.SAMPLE_LOG_PROB)).exp()
    clip = settings.clip_epsilon
    surrogate = torch.min(ratio * advantage, ratio.clamp(1 - clip, 1 + clip) * advantage)
    loss_policy = -surrogate.mean()
    loss_value = 0.5 * (critic(observation) - batch.get(keys.VALUE_TARGET)).pow(2).mean()
    loss = loss_policy + settings.value_coef * loss_value - settings.entropy_coef * entropy.mean()
    parts = {
        "loss_policy": loss_policy.item(),
        "loss_value": loss_value.item(),
        "entropy": entropy.mean().item(),
        "clip_fraction": ((ratio - 1).abs() > clip).float().mean().item(),
    }
    return loss, parts


def batch_settings(cfg: DictConfig, collector: Any, lr_schedule: Any) -> LossSettings:
    """The loss settings for the batch just collected, the learning rate and the clip range
    annealed to where training stands (`ppo.anneal_lr`, `ppo.anneal_clip`)."""
    total = collector.total_frames
    progress = (collector.frames - collector.frames_per_batch) / total if total > 0 else 0.0
    if cfg.ppo.anneal_lr and total > 0:
        lr_schedule.set(progress)
    clip_factor = lr_schedule.factor(progress) if cfg.ppo.anneal_clip and total > 0 else 1.0
    return LossSettings.from_config(cfg, clip_factor)


def update(
    cfg: DictConfig,
    actor: nn.Module,
    critic: nn.Module,
    optimizer: torch.optim.Optimizer,
    transitions: TensorDictBase,
    minibatch_size: int,
    key: Any,
    settings: LossSettings,
) -> dict[str, float]:
    """`cfg.ppo.epochs` epochs of shuffled minibatches of `transitions` (observations under
    `key`); returns the mean of each part of the loss."""
    sums: dict[str, float] = dict.fromkeys(LOSS_COLUMNS[:-2], 0.0)
    updates = 0
    for _ in range(cfg.ppo.epochs):
        for minibatch in RolloutBuffer.iterate_minibatches(transitions, minibatch_size):
            loss, parts = ppo_loss(actor, critic, minibatch, key, settings)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(optimizer.param_groups[0]["params"], cfg.ppo.max_grad_norm)
            optimizer.step()
            updates += 1
            for name, part in parts.items():
                sums[name] += part
    return {name: total / updates for name, total in sums.items()}


def check_config(cfg: DictConfig) -> None:
    """Stop before any work when the config is wrong, naming the key."""
    validate(
        cfg,
        targets=["env.make", "collector", "actor", "critic", "optim", "gae", "logger"],
        positive_ints=["ppo.epochs", "ppo.num_minibatches", "torch_threads"],
        nonnegative_ints=["eval_episodes", "eval_every"],
        fractions=["gae.gamma", "gae.lmbda"],
        positive_numbers=["ppo.clip_epsilon", "ppo.max_grad_norm"],
    )
    refuse_collector_option(
        cfg,
        "collector.split_trajs",
        "PPO computes GAE and its loss on [envs, time] batches; padded split trajectories would "
        "enter both. Leave collector.split_trajs=false.",
    )
    refuse_collector_option(
        cfg,
        "collector.init_random_frames",
        "PPO's loss needs the log-probability of each action under the policy that chose it; "
        "random actions have none. Leave collector.init_random_frames unset.",
    )
    check_video_config(cfg)
    minibatch = cfg.collector.frames_per_batch // cfg.ppo.num_minibatches
    if minibatch < 1:
        raise ConfigError(
            f"ppo.num_minibatches={cfg.ppo.num_minibatches} is larger than "
            f"collector.frames_per_batch={cfg.collector.frames_per_batch}; use fewer minibatches."
        )


@dataclass
class TrainingParts:
    """What an actor-critic run checkpoints and resumes (PPO, MAPPO, PPO over the
    RolloutBuffer): the two networks, their optimiser and the collector."""

    actor: nn.Module
    critic: nn.Module
    optimizer: torch.optim.Optimizer
    collector: Any

    def resume(self, state: dict[str, Any], lr_schedule: Any = None) -> float | None:
        """Load `state`; with `lr_schedule`, the learning rate goes on from where the run
        stopped (returns its factor, None when there is no schedule or no frame budget)."""
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.optimizer.load_state_dict(state["optimizer"])
        collector = self.collector
        collector.load_state_dict(state["collector"])
        if lr_schedule is None or collector.total_frames <= 0:
            return None
        return float(lr_schedule.continue_from(collector.frames / collector.total_frames))

    def checkpoint(self, cfg: DictConfig, script: str) -> dict[str, Any]:
        """The checkpoint of the run now."""
        return {
            **checkpoint_identity(cfg, script),
            "frames": self.collector.frames,
            "collector": self.collector.state_dict(),
            "actor": self.actor.state_dict(),
            "critic": self.critic.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }


def train(cfg: DictConfig) -> float:
    """Train PPO as `cfg` says; returns the mean return of the last 100 training episodes at
    the end, the objective an Optuna sweep (`--multirun +sweep=ppo_optuna`) maximises."""
    # --- set-up: everything from the config, checked before any work ---
    check_config(cfg)
    state: dict[str, Any] = resume_state(cfg, "ppo", ("actor", "critic", "optimizer", "collector"))
    torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    env_factory = build_partial(cfg, "env.make")
    info = probe_env(env_factory)
    key = info.observation_key
    actor = build(cfg, "actor", info=info)
    critic = build(cfg, "critic", info=info)
    policy = TensorDictModule(actor, in_keys=[key], out_keys=[keys.ACTION, keys.SAMPLE_LOG_PROB])
    value = TensorDictModule(critic, in_keys=[key], out_keys=[keys.STATE_VALUE])
    optimizer = build(cfg, "optim", params=[*actor.parameters(), *critic.parameters()])
    lr_schedule = LinearLearningRate(optimizer, end_factor=0.0)
    gae = build(cfg, "gae", value_network=value)
    collector = build(cfg, "collector", create_env_fn=env_factory, policy=policy)
    collector.set_seed(cfg.seed)

    parts = TrainingParts(actor, critic, optimizer, collector)
    if state:
        factor = parts.resume(state, lr_schedule if cfg.ppo.anneal_lr else None)
        if factor is not None:
            log.info(
                f"resumed at {collector.frames} frames: the learning rate goes on from "
                f"{factor:.3g}x optim.lr down to 0 at {collector.total_frames} frames"
            )

    minibatch_size = collector.frames_per_batch // cfg.ppo.num_minibatches
    columns = (*LOSS_COLUMNS, EVAL_RETURN, WEIGHT_UPDATE)
    recorder = RunRecorder.for_run(cfg, collector, state, f"PPO {cfg.env.id}", columns)
    video = EvaluationVideo(cfg, recorder.run_dir, recorder.logger)
    eval_seed = cfg.seed + EVAL_SEED_OFFSET
    # Greedy episodes every eval_every frames, in a worker process (the actor's mode).
    outputs = [keys.ACTION, keys.SAMPLE_LOG_PROB]
    evaluation = PeriodicEvaluation(
        cfg, actor, [key], collector.frames, recorder.run_dir, out_keys=outputs
    )
    if state:
        evaluation.resume(state.get("best_policy"))

    def checkpoint() -> dict[str, Any]:
        return {**parts.checkpoint(cfg, "ppo"), "best_policy": evaluation.best}

    with StopOnInterrupt() as stop:  # Ctrl-C: leave the loop, save, exit
        for iteration, data in enumerate(collector, 1):
            # --- advantages: one value-network call over the batch ---
            data = gae(data)

            # --- update: epochs of shuffled minibatches ---
            settings = batch_settings(cfg, collector, lr_schedule)
            transitions = data.select(key, *LOSS_INPUTS)  # shuffle only what the loss reads
            means = update(
                cfg, actor, critic, optimizer, transitions, minibatch_size, key, settings
            )

            # --- push the new weights to the collector, log, checkpoint, video ---
            with recorder.timed(WEIGHT_UPDATE):
                collector.update_policy_weights_()
            lr = optimizer.param_groups[0]["lr"]
            eval_return = evaluation.run_if_due(collector.frames)
            recorder.log(
                collector.stats(), **means, lr=lr, clip_epsilon=settings.clip_epsilon,
                eval_return=eval_return,
            )  # fmt: skip
            if recorder.checkpoint_due(collector.frames):
                recorder.save(collector.frames, checkpoint)
            if video.due(iteration, last=collector.is_done):
                video.record(policy, collector.frames, eval_seed)
            if stop.requested:
                break
        evaluation.finish(recorder, collector.stats(), wait=not stop.requested)

    recorder.save(collector.frames, checkpoint)
    recorder.close()
    collector.shutdown()
    if not stop.requested:
        report_run(recorder, env_factory, policy, cfg.eval_episodes, seed=eval_seed)
        video.record(policy, collector.frames, eval_seed, final=True)
        evaluation.report_best()
    recorder.finish()
    stop.exit_if_requested(recorder.run_dir)
    return float(recorder.last_row.get(WINDOW_RETURN, float("nan")))


@hydra.main(config_path="conf", config_name="ppo", version_base=None)
def main(cfg: DictConfig) -> float:
    return run_or_exit(train, cfg)


if __name__ == "__main__":
    check_overrides("ppo", sys.argv[1:])
    check_extras("ppo", sys.argv[1:])
    main()

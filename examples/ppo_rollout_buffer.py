"""PPO that follows the RolloutBuffer reference page step by step: the buffer, `collect`, GAE
over the rollout, `transition_view` and `iterate_minibatches`.

Run from the repository root:

    python examples/ppo_rollout_buffer.py                   # CartPole-v1, 8 envs, 122,880 frames
    python examples/ppo_rollout_buffer.py env=pendulum_batched collector.total_frames=1000000

The networks, the loss and every hyperparameter are examples/ppo.py's (conf/ppo.yaml is this
config's default); the data path is the page's: the collector writes each rollout, the
policy's values and the bootstrap value `value[:, -1]` included, into the buffer's fields in
place, and GAE runs over the rollout without another network call. The run directory receives
metrics.csv, return.png and checkpoint.pt, as with examples/ppo.py.
"""

from __future__ import annotations

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
    collector_has_workers,
    resume_state,
    run_or_exit,
)
from common.env_info import EnvInfo, probe_env
from common.evaluation import EVAL_SEED_OFFSET, report_run
from common.extras import check_extras
from common.interrupt import StopOnInterrupt
from common.recorder import WEIGHT_UPDATE, RunRecorder
from common.schedules import LinearLearningRate
from common.video import EvaluationVideo
from omegaconf import DictConfig
from ppo import LOSS_COLUMNS, LossSettings, TrainingParts, batch_settings, ppo_loss
from ppo import check_config as check_ppo_config
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

from rlcollect import keys
from rlcollect.replay import (
    RolloutBuffer,
    iterate_minibatches,
    torchrl_transitions,
    transition_view,
)

log = logging.getLogger(__name__)  # Hydra sends it to the console and the job log

SCRIPT = "ppo_rollout_buffer"


class ActorCritic(nn.Module):
    """The collector's policy: the actor's action and log-probability and the critic's value of
    one observation, so that the collector fills `action`, `sample_log_prob` and `value`."""

    def __init__(self, actor: nn.Module, critic: nn.Module) -> None:
        super().__init__()
        self.actor, self.critic = actor, critic

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, ...]:
        action, log_prob = self.actor(observation)
        return action, log_prob, self.critic(observation)


def update(
    cfg: DictConfig,
    actor: nn.Module,
    critic: nn.Module,
    optimizer: torch.optim.Optimizer,
    flat_rollout: TensorDictBase,
    minibatch_size: int,
    settings: LossSettings,
) -> dict[str, float]:
    """`cfg.ppo.epochs` epochs of the page's shuffled minibatches of `flat_rollout` (every
    transition once per epoch); returns the mean of each part of examples/ppo.py's loss."""
    sums: dict[str, float] = dict.fromkeys(LOSS_COLUMNS[:-2], 0.0)
    updates = 0
    for _ in range(cfg.ppo.epochs):
        for batch in iterate_minibatches(flat_rollout, minibatch_size, cfg.buffer_device):
            # batch["obs"], batch["action"], batch["advantage"] ... under the keys ppo_loss reads
            loss, parts = ppo_loss(
                actor, critic, torchrl_transitions(batch), keys.OBSERVATION, settings
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(optimizer.param_groups[0]["params"], cfg.ppo.max_grad_norm)
            optimizer.step()
            updates += 1
            for name, part in parts.items():
                sums[name] += part
    return {name: total / updates for name, total in sums.items()}


def check_config(cfg: DictConfig) -> None:
    """examples/ppo.py's checks, and a collector that fills the buffer in this process."""
    check_ppo_config(cfg)
    if collector_has_workers(cfg):
        raise ConfigError(
            f"collector: {cfg.collector._target_} runs its loops in worker processes or Ray "
            "actors; collect() fills the RolloutBuffer in place, in this process. Use "
            "collector=single (with env.make._target_=rlcollect.envs.ParallelEnv for envs in "
            "worker processes)."
        )


def buffer_sizes(cfg: DictConfig, info: EnvInfo) -> tuple[int, int, int, int]:
    """`(num_envs, rollout_len, obs_dim, action_dim)` of the page's buffer for this env.

    Raises:
        ConfigError: the env is not a batch of envs, or the batch does not divide the frames.
    """
    if len(info.batch_size) != 1:
        raise ConfigError(
            f"env: the RolloutBuffer holds [num_envs, T + 1] rollouts; env.id={cfg.env.id} "
            f"gives batch {tuple(info.batch_size)}. Use a batched env, e.g. env=cartpole_batched."
        )
    num_envs, frames = info.batch_size[0], cfg.collector.frames_per_batch
    if frames % num_envs:
        raise ConfigError(
            f"collector.frames_per_batch={frames} is not a multiple of the {num_envs} envs; "
            f"use e.g. {num_envs * max(1, frames // num_envs)}."
        )
    action_dim = 1 if info.is_discrete else math.prod(info.action_shape)
    return num_envs, frames // num_envs, math.prod(info.observation_shape), action_dim


def train(cfg: DictConfig) -> None:
    # --- set-up: everything from the config, checked before any work ---
    check_config(cfg)
    state: dict[str, Any] = resume_state(cfg, SCRIPT, ("actor", "critic", "optimizer", "collector"))
    torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    env_factory = build_partial(cfg, "env.make")
    info = probe_env(env_factory)
    num_envs, rollout_len, obs_dim, action_dim = buffer_sizes(cfg, info)
    actor = build(cfg, "actor", info=info)
    critic = build(cfg, "critic", info=info)
    policy = TensorDictModule(
        ActorCritic(actor, critic),
        in_keys=[info.observation_key],
        out_keys=[keys.ACTION, keys.SAMPLE_LOG_PROB, keys.STATE_VALUE],
    )
    optimizer = build(cfg, "optim", params=[*actor.parameters(), *critic.parameters()])
    lr_schedule = LinearLearningRate(optimizer, end_factor=0.0)
    gae = build(cfg, "gae")
    collector = build(cfg, "collector", create_env_fn=env_factory, policy=policy)
    collector.set_seed(cfg.seed)
    buffer = RolloutBuffer(num_envs, rollout_len, obs_dim, action_dim, cfg.buffer_device)

    parts = TrainingParts(actor, critic, optimizer, collector)
    if state:
        parts.resume(state, lr_schedule if cfg.ppo.anneal_lr else None)

    def checkpoint() -> dict[str, Any]:
        return parts.checkpoint(cfg, SCRIPT)

    minibatch_size = collector.frames_per_batch // cfg.ppo.num_minibatches
    recorder = RunRecorder.for_run(
        cfg,
        collector,
        state,
        f"PPO (RolloutBuffer) {cfg.env.id}",
        extra_columns=(*LOSS_COLUMNS, WEIGHT_UPDATE),
    )
    greedy_policy = TensorDictModule(
        actor, in_keys=[info.observation_key], out_keys=[keys.ACTION, keys.SAMPLE_LOG_PROB]
    )
    video = EvaluationVideo(cfg, recorder.run_dir, recorder.logger)
    eval_seed = cfg.seed + EVAL_SEED_OFFSET

    with StopOnInterrupt() as stop:
        iteration = 0
        while not collector.is_done and not stop.requested:
            # --- collect: the page's rollout, values and bootstrap value written in place ---
            rollout = collector.collect(num_steps=rollout_len, rollout=buffer.start_rollout())
            buffer.add(rollout)

            # --- advantages: GAE over the [N, T + 1] rollout (value[:, -1] bootstraps) ---
            rollout = buffer.get(flatten=False)
            gae(rollout)

            # --- update: epochs of shuffled minibatches of the N * T transitions ---
            settings = batch_settings(cfg, collector, lr_schedule)
            flat_rollout = transition_view(rollout, flatten=True)
            means = update(cfg, actor, critic, optimizer, flat_rollout, minibatch_size, settings)

            # --- push the new weights to the collector, log, checkpoint, video ---
            with recorder.timed(WEIGHT_UPDATE):
                collector.update_policy_weights_()
            lr = optimizer.param_groups[0]["lr"]
            recorder.log(collector.stats(), **means, lr=lr, clip_epsilon=settings.clip_epsilon)
            if recorder.checkpoint_due(collector.frames):
                recorder.save(collector.frames, checkpoint)
            iteration += 1
            if video.due(iteration, last=collector.is_done):
                video.record(greedy_policy, collector.frames, eval_seed)

    recorder.save(collector.frames, checkpoint)
    recorder.close()
    collector.shutdown()
    if not stop.requested:
        report_run(recorder, env_factory, greedy_policy, cfg.eval_episodes, seed=eval_seed)
        video.record(greedy_policy, collector.frames, eval_seed, final=True)
    recorder.finish()
    stop.exit_if_requested(recorder.run_dir)


@hydra.main(config_path="conf", config_name=SCRIPT, version_base=None)
def main(cfg: DictConfig) -> None:
    run_or_exit(train, cfg)


if __name__ == "__main__":
    check_overrides(SCRIPT, sys.argv[1:])
    check_extras(SCRIPT, sys.argv[1:])
    main()

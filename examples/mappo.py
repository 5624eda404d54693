"""MAPPO with rlcollect: shared-parameter PPO over a group of agents, grouped GAE.

One actor and one critic are shared by every agent of the group (`env.group`); each reads its
own agent's observation. The collector steps a batch of PettingZoo envs (mpe2's simple_spread:
3 agents cover 3 landmarks), GAE runs per agent on the grouped batch (the env-level done flags
broadcast over the agents), and the PPO loss of `ppo.py` trains on the group's agent-steps.
Frames count env steps (each holds a step of every agent); returns are per agent (the mean
over the group) and per episode.

Run from the repository root:

    python examples/mappo.py                          # simple_spread_v3, 8 envs, 1M frames
    python examples/mappo.py collector.total_frames=2000000 ppo.entropy_coef=0

The run directory (Hydra's output dir) receives metrics.csv, return.png and checkpoint.pt; the
run ends with the trained policy's greedy evaluation next to a random policy's, measured the
same way (same episodes, same seeds).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import hydra
import torch
from common.config import (
    ConfigError,
    build,
    build_partial,
    check_overrides,
    check_target_arguments,
    refuse_collector_option,
    require_bool,
    require_fraction,
    require_nonnegative_int,
    require_positive_int,
    require_positive_number,
    require_target,
    resume_path,
    resume_state,
    run_or_exit,
)
from common.evaluation import EVAL_SEED_OFFSET, evaluate
from common.extras import check_extras
from common.interrupt import StopOnInterrupt
from common.metrics import MEAN_RETURN, WINDOW_RETURN, set_in_last_row
from common.multi_agent import probe_group
from common.recorder import WEIGHT_UPDATE, RunRecorder
from common.schedules import LinearLearningRate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from ppo import LOSS_COLUMNS, LOSS_INPUTS, TrainingParts, batch_settings, update
from tensordict.nn import TensorDictModule

from rlcollect import keys

log = logging.getLogger(__name__)  # Hydra sends it to the console and the job log

RANDOM_EVAL_RETURN = "random_eval_return"


def check_config(cfg: DictConfig) -> None:
    """Stop before any work when the config is wrong, naming the key (`ppo.py`'s checks, but
    the env is a PettingZoo env, not a Gymnasium id)."""
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:
        raise ConfigError(f"{getattr(err, 'full_key', None) or 'config'}: {err}") from err
    targets = ["env.make", "env.make_single", "collector", "actor", "critic", "optim", "gae"]
    for key in [*targets, "logger"]:
        require_target(cfg, key)
        check_target_arguments(cfg, key)
    for key in ["collector.frames_per_batch", "ppo.epochs", "ppo.num_minibatches", "torch_threads"]:
        require_positive_int(cfg, key)
    require_positive_int(cfg, "collector.total_frames", allow_endless=True)
    for key in ["seed", "checkpoint_every", "eval_episodes"]:
        require_nonnegative_int(cfg, key)
    for key in ["gae.gamma", "gae.lmbda"]:
        require_fraction(cfg, key)
    for key in ["ppo.clip_epsilon", "ppo.max_grad_norm"]:
        require_positive_number(cfg, key)
    require_bool(cfg, "progress")
    resume_path(cfg)
    for option in ["collector.split_trajs", "collector.init_random_frames"]:
        refuse_collector_option(
            cfg, option, "MAPPO trains on [envs, time] batches of its own policy's actions."
        )


def per_agent(stats: dict[str, Any], n_agents: int) -> dict[str, Any]:
    """The collector's statistics with episode returns per agent: the collector sums the
    rewards of all agents of a step."""
    return {
        **stats,
        MEAN_RETURN: stats[MEAN_RETURN] / n_agents,
        WINDOW_RETURN: stats[WINDOW_RETURN] / n_agents,
    }


def train(cfg: DictConfig) -> None:
    # --- set-up: everything from the config, checked before any work ---
    check_config(cfg)
    state: dict[str, Any] = resume_state(
        cfg, "mappo", ("actor", "critic", "optimizer", "collector")
    )
    torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    env_factory = build_partial(cfg, "env.make")
    group = str(cfg.env.group)
    info, n_agents = probe_group(env_factory, group)
    actor = build(cfg, "actor", info=info)
    critic = build(cfg, "critic", info=info)
    observation = (group, keys.OBSERVATION)
    policy = TensorDictModule(
        actor,
        in_keys=[observation],
        out_keys=[(group, keys.ACTION), (group, keys.SAMPLE_LOG_PROB)],
    )
    value = TensorDictModule(critic, in_keys=[observation], out_keys=[(group, keys.STATE_VALUE)])
    optimizer = build(cfg, "optim", params=[*actor.parameters(), *critic.parameters()])
    lr_schedule = LinearLearningRate(optimizer, end_factor=0.0)
    gae = build(cfg, "gae", value_network=value).set_keys(
        reward=(group, keys.REWARD),
        advantage=(group, keys.ADVANTAGE),
        value_target=(group, keys.VALUE_TARGET),
    )  # done and terminated: the env-level flags, broadcast over the agents
    collector = build(cfg, "collector", create_env_fn=env_factory, policy=policy)
    collector.set_seed(cfg.seed)

    parts = TrainingParts(actor, critic, optimizer, collector)
    if state:
        parts.resume(state, lr_schedule if cfg.ppo.anneal_lr else None)

    def checkpoint() -> dict[str, Any]:
        return parts.checkpoint(cfg, "mappo")

    agent_steps = collector.frames_per_batch * n_agents
    minibatch_size = max(1, agent_steps // cfg.ppo.num_minibatches)
    recorder = RunRecorder.for_run(
        cfg,
        collector,
        state,
        f"MAPPO {cfg.env.id} (return per agent)",
        extra_columns=(*LOSS_COLUMNS, WEIGHT_UPDATE),
    )

    with StopOnInterrupt() as stop:
        for data in collector:
            # --- advantages: per agent, one value-network call over the batch ---
            data = gae(data)

            # --- update: the group's agent-steps, shuffled into minibatches, shared networks ---
            settings = batch_settings(cfg, collector, lr_schedule)
            transitions = data.get(group).select(keys.OBSERVATION, *LOSS_INPUTS).reshape(-1)
            means = update(
                cfg,
                actor,
                critic,
                optimizer,
                transitions,
                minibatch_size,
                keys.OBSERVATION,
                settings,
            )

            # --- push the new weights to the collector, log, checkpoint ---
            with recorder.timed(WEIGHT_UPDATE):
                collector.update_policy_weights_()
            lr = optimizer.param_groups[0]["lr"]
            stats = per_agent(collector.stats(), n_agents)
            recorder.log(stats, **means, lr=lr, clip_epsilon=settings.clip_epsilon)
            if recorder.checkpoint_due(collector.frames):
                recorder.save(collector.frames, checkpoint)
            if stop.requested:
                break

    recorder.save(collector.frames, checkpoint)
    recorder.close()
    collector.shutdown()
    if not stop.requested:
        report(cfg, recorder, build_partial(cfg, "env.make_single"), policy, group)
    recorder.finish()
    stop.exit_if_requested(recorder.run_dir)


def report(
    cfg: DictConfig, recorder: RunRecorder, env_factory: Any, policy: Any, group: str
) -> None:
    """Log the run's summary, then evaluate the trained policy (greedily) and a random policy
    on the same episodes (same count, same seeds) and log both returns per agent."""
    row = recorder.last_row
    log.info(
        f"frames={row.get('frames', recorder.frames)} wall_time_s={recorder.elapsed:.1f} "
        f"mean_episode_return_per_agent={row.get(MEAN_RETURN, float('nan')):.2f} "
        f"run_dir={recorder.run_dir}"
    )
    episodes = cfg.eval_episodes
    if episodes == 0:
        return
    seed = cfg.seed + EVAL_SEED_OFFSET
    reward_key = (keys.NEXT, group, keys.REWARD)
    trained = evaluate(env_factory, policy, episodes, seed, reward_key=reward_key)
    random = evaluate(env_factory, None, episodes, seed, reward_key=reward_key)
    log.info(
        f"greedy evaluation: mean return per agent {trained:.2f} over {episodes} episodes; "
        f"random policy, same episodes: {random:.2f}"
    )
    recorder.record_final_evaluation(trained)
    set_in_last_row(recorder.metrics.path, RANDOM_EVAL_RETURN, random)


@hydra.main(config_path="conf", config_name="mappo", version_base=None)
def main(cfg: DictConfig) -> None:
    run_or_exit(train, cfg)


if __name__ == "__main__":
    check_overrides("mappo", sys.argv[1:])
    check_extras("mappo", sys.argv[1:])
    main()

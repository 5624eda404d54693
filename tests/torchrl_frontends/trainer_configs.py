"""TorchRL's config-system trainers as its `sota-implementations/*_trainer` scripts compose them
from TorchRL's own Hydra config groups, tiny: DQN on CartPole and PPO on Pendulum, with the
collector group and the implementation (TorchRL's `_target_` or ours) picked per run.

Used by `test_trainers.py` and by `patch_scripts/ppo_trainer.py` (run under the launcher).
TorchRL's config groups must be in Hydra's store (`tests/hydra_store.py`).
"""

from __future__ import annotations

import copy
from typing import Any

from hydra import compose, initialize
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra

FRAMES = 64  # per batch
BATCHES = 3
# The target each config group's collector takes, per implementation.
TARGETS = {
    "torchrl": {
        "sync": "torchrl.collectors.Collector",
        "multi_sync": "torchrl.collectors.MultiSyncCollector",
        "multi_async": "torchrl.collectors.MultiAsyncCollector",
    },
    "rlcollect": {
        "sync": "rlcollect.Collector",
        "multi_sync": "rlcollect.MultiSyncCollector",
        "multi_async": "rlcollect.MultiAsyncCollector",
    },
}

# TorchRL's buffers count in `mp.Value`s unless compilable; its semaphores would outlive the
# test (the fixtures would count them against our collectors).
STORAGE = {"device": "cpu", "ndim": 1, "compilable": True}
WRITER = {"writer": {"compilable": True}}

# The training env both trainers use, as TorchRL's trainer configs compose it: a Gym env with a
# step counter (50 steps) and a reward sum, in a TransformedEnv.
TRAINING_ENV_DEFAULTS: list[Any] = [
    {"transform@transform0": "step_counter"},
    {"transform@transform1": "reward_sum"},
    {"env@training_env": "transformed_env"},
    {"env@training_env.base_env": "gym"},
    {"transform@training_env.transform": "compose"},
]


def training_env(env_name: str) -> dict[str, Any]:
    """The config entries of that env on `env_name` (with `TRAINING_ENV_DEFAULTS`)."""
    return {
        "transform0": {"max_steps": 50, "step_count_key": "step_count"},
        "transform1": {"in_keys": ["reward"], "out_keys": ["reward_sum"]},
        "training_env": {
            "base_env": {"env_name": env_name},
            "transform": {"transforms": ["${transform0}", "${transform1}"]},
            "_partial_": True,
        },
    }


# DQN on CartPole, as dqn_trainer composes it: a transformed Gym env (the script batches it
# in a TorchRL ParallelEnv of one, whose shared memory the fixtures would count against our
# collectors), a Q-value model, a replay buffer, TorchRL's DQN trainer (it adds e-greedy).
DQN = {
    "defaults": [
        *TRAINING_ENV_DEFAULTS,
        {"model@models.qvalue_model": "qvalue"},
        {"network@networks.qvalue_network": "mlp"},
        {"collector@collector": "sync"},
        {"replay_buffer@replay_buffer": "base"},
        {"storage@replay_buffer.storage": "lazy_tensor"},
        {"writer@replay_buffer.writer": "round_robin"},
        {"sampler@replay_buffer.sampler": "random"},
        {"trainer@trainer": "dqn"},
        {"optimizer@optimizer": "adam"},
        {"loss@loss": "dqn"},
        {"target_net_updater@target_net_updater": "hard"},
        "_self_",
    ],
    "networks": {"qvalue_network": {"in_features": 4, "out_features": 2, "num_cells": [16]}},
    "models": {
        "qvalue_model": {
            "in_keys": ["observation"],
            "action_value_key": "action_value",
            "action_space": "one-hot",
            "network": "${networks.qvalue_network}",
        }
    },
    **training_env("CartPole-v1"),
    "loss": {"value_network": "${models.qvalue_model}", "action_space": "one-hot"},
    "target_net_updater": {"value_network_update_interval": 5},
    "collector": {
        "create_env_fn": "${training_env}",
        "policy": "${models.qvalue_model}",
        "total_frames": BATCHES * FRAMES,
        "frames_per_batch": FRAMES,
        "init_random_frames": FRAMES,
        "_partial_": True,
    },
    "replay_buffer": {"storage": {**STORAGE, "max_size": 1000}, **WRITER, "batch_size": 16},
    "trainer": {
        "collector": "${collector}",
        "optimizer": "${optimizer}",
        "replay_buffer": "${replay_buffer}",
        "target_net_updater": "${target_net_updater}",
        "loss_module": "${loss}",
        "value_network": "${models.qvalue_model}",
        "logger": None,
        "total_frames": "${collector.total_frames}",
        "progress_bar": False,
        "seed": 1,
        "save_trainer_file": None,
        "optim_steps_per_batch": 4,
        "async_collection": False,
    },
}

# PPO on Pendulum, as ppo_trainer composes it (a multi-process collector there; the env as in DQN).
PPO = {
    "defaults": [
        *TRAINING_ENV_DEFAULTS,
        {"model@models.policy_model": "tanh_normal"},
        {"model@models.value_model": "value"},
        {"network@networks.policy_network": "mlp"},
        {"network@networks.value_network": "mlp"},
        {"collector@collector": "multi_async"},
        {"replay_buffer@replay_buffer": "base"},
        {"storage@replay_buffer.storage": "lazy_tensor"},
        {"writer@replay_buffer.writer": "round_robin"},
        {"sampler@replay_buffer.sampler": "without_replacement"},
        {"trainer@trainer": "ppo"},
        {"optimizer@optimizer": "adam"},
        {"loss@loss": "ppo"},
        "_self_",
    ],
    "networks": {
        "policy_network": {"in_features": 3, "out_features": 2, "num_cells": [16]},
        "value_network": {"in_features": 3, "out_features": 1, "num_cells": [16]},
    },
    "models": {
        "policy_model": {
            "return_log_prob": True,
            "in_keys": ["observation"],
            "param_keys": ["loc", "scale"],
            "out_keys": ["action"],
            "network": "${networks.policy_network}",
        },
        "value_model": {
            "in_keys": ["observation"],
            "out_keys": ["state_value"],
            "network": "${networks.value_network}",
        },
    },
    **training_env("Pendulum-v1"),
    "loss": {"actor_network": "${models.policy_model}", "critic_network": "${models.value_model}"},
    "collector": {
        "create_env_fn": "${training_env}",
        "policy": "${models.policy_model}",
        "total_frames": BATCHES * FRAMES,
        "frames_per_batch": FRAMES,
        "num_workers": 2,
        "_partial_": True,
    },
    "replay_buffer": {
        "storage": {**STORAGE, "max_size": FRAMES},
        **WRITER,
        "sampler": {"drop_last": True, "shuffle": True},
        "batch_size": 32,
    },
    "trainer": {
        "collector": "${collector}",
        "optimizer": "${optimizer}",
        "replay_buffer": "${replay_buffer}",
        "loss_module": "${loss}",
        "logger": None,
        "total_frames": BATCHES * FRAMES,
        "progress_bar": False,
        "seed": 1,
        "save_trainer_file": None,
        "optim_steps_per_batch": None,
        "num_epochs": 1,
        "async_collection": False,
    },
}
CONFIGS = {"dqn": DQN, "ppo": PPO}


def compose_trainer(name: str, collector: str, implementation: str) -> Any:
    """The trainer config `name` with the collector group `collector`, built by
    `implementation`'s class (TorchRL's `_target_` replaced by ours)."""
    node = copy.deepcopy(CONFIGS[name])
    node["defaults"] = [
        {"collector@collector": collector} if "collector@collector" in entry else entry
        for entry in node["defaults"]
    ]
    node["collector"]["_target_"] = TARGETS[implementation][collector]
    if collector == "sync":
        node["collector"].pop("num_workers", None)
    else:
        node["collector"]["num_workers"] = 2
    ConfigStore.instance().store(name=f"rlcollect_{name}", node=node)
    GlobalHydra.instance().clear()
    with initialize(version_base="1.3"):
        return compose(config_name=f"rlcollect_{name}")

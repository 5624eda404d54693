"""RLlib's PPO trains on CartPole with `env_runner_cls=rlcollect.rllib.SingleAgentEnvRunner`:
the Algorithm builds our class locally or as a remote Ray actor, samples through it, and pushes
its new weights to it after each update."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip(
    "ray.rllib",
    reason="RLlib is not importable: install the rllib extra (pip install 'rlcollect[rllib]')",
    exc_type=ImportError,
)

from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME

from rlcollect.rllib import SingleAgentEnvRunner

TRAINING_TIMEOUT = 420
ITERATIONS = 3
BATCH = 400


def ppo_config(num_env_runners: int) -> PPOConfig:
    return (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(
            env_runner_cls=SingleAgentEnvRunner,
            num_env_runners=num_env_runners,
            num_envs_per_env_runner=4,
            num_cpus_per_env_runner=1,
        )
        .training(train_batch_size_per_learner=BATCH, minibatch_size=100, num_epochs=2)
        .debugging(seed=0)
    )


def runner_facts(runner: SingleAgentEnvRunner) -> dict:
    weights = runner.get_state(components=COMPONENT_RL_MODULE)[COMPONENT_RL_MODULE]
    return {
        "cls": type(runner).__name__,
        "module": type(runner).__module__,
        "fast": runner.uses_fast_path if runner.env is not None else None,
        "seq_no": runner._weights_seq_no,
        "weights": {name: np.asarray(value) for name, value in weights.items()},
    }


@pytest.mark.timeout(TRAINING_TIMEOUT)
@pytest.mark.usefixtures("no_leftover_children")
@pytest.mark.parametrize("num_env_runners", [0, 1], ids=["local", "one-remote"])
def test_ppo_trains_through_our_runner(num_env_runners):
    algo = ppo_config(num_env_runners).build_algo()
    try:
        sampled = []
        for _ in range(ITERATIONS):
            result = algo.train()
            sampled.append(result[ENV_RUNNER_RESULTS][NUM_ENV_STEPS_SAMPLED_LIFETIME])
        # Every iteration sampled a batch (at least BATCH steps, fewer than BATCH + 4 envs).
        assert BATCH * ITERATIONS <= sampled[-1] < (BATCH + 4) * ITERATIONS
        assert np.all(np.diff(sampled) >= BATCH)
        assert result[ENV_RUNNER_RESULTS]["episode_return_mean"] > 0
        facts = algo.env_runner_group.foreach_env_runner(
            runner_facts, local_env_runner=num_env_runners == 0
        )
        assert len(facts) == 1
        (fact,) = facts
        assert (fact["cls"], fact["module"]) == (
            "SingleAgentEnvRunner",
            "rlcollect.rllib.single_agent",
        )
        assert fact["fast"] is True
        # The Learner's weights after the last update reached the runner that samples.
        assert fact["seq_no"] >= ITERATIONS - 1
        learned = algo.learner_group.get_state(components=f"learner/{COMPONENT_RL_MODULE}")
        learner_weights = learned["learner"][COMPONENT_RL_MODULE][DEFAULT_MODULE_ID]
        for name, value in fact["weights"].items():
            np.testing.assert_allclose(value, np.asarray(learner_weights[name]), rtol=0, atol=0)
    finally:
        algo.stop()

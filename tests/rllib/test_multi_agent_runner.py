"""`rlcollect.rllib.MultiAgentEnvRunner` beside RLlib's own: counts, chunk continuation, whole
episodes, per-agent outputs, state; and PPO on two-agent CartPole built with it."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip(
    "ray.rllib",
    reason="RLlib is not importable: install the rllib extra (pip install 'rlcollect[rllib]')",
    exc_type=ImportError,
)

from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core import COMPONENT_RL_MODULE
from ray.rllib.core.columns import Columns
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner as RLlibRunner
from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    WEIGHTS_SEQ_NO,
)

from rlcollect.rllib import MultiAgentEnvRunner, SingleAgentEnvRunner

RUNNER_TIMEOUT = 300


def policy_of(agent_id: int, *args: object, **kwargs: object) -> str:
    return f"p{agent_id}"


def two_agent_config(num_envs: int = 2) -> PPOConfig:
    return (
        PPOConfig()
        .environment(MultiAgentCartPole, env_config={"num_agents": 2})
        .env_runners(num_envs_per_env_runner=num_envs)
        .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=policy_of)
    )


@pytest.mark.timeout(RUNNER_TIMEOUT)
def test_sample_matches_rllibs_runner_in_counts_agents_and_outputs():
    config = two_agent_config()
    ours, theirs = (
        MultiAgentEnvRunner(config=config, worker_index=1),
        RLlibRunner(config=config, worker_index=1),
    )
    for n in (1, 50, 101):
        episodes = ours.sample(num_timesteps=n)
        assert n <= sum(episode.env_steps() for episode in episodes) < n + 2
    # From a reset, so that both agents act in the first chunk (an ongoing episode's next chunk
    # holds only the agents still alive in it).
    ours_episode = ours.sample(num_timesteps=60, force_reset=True)[0]
    their_episode = theirs.sample(num_timesteps=60, force_reset=True)[0]
    assert sorted(ours_episode.agent_episodes) == sorted(their_episode.agent_episodes) == [0, 1]
    for agent_id, agent_episode in ours_episode.agent_episodes.items():
        assert set(agent_episode.extra_model_outputs) == set(
            their_episode.agent_episodes[agent_id].extra_model_outputs
        )
        assert Columns.ACTION_LOGP in agent_episode.extra_model_outputs
        assert agent_episode.module_id == f"p{agent_id}"
    ours.stop()
    theirs.stop()


@pytest.mark.timeout(RUNNER_TIMEOUT)
def test_chunks_continue_and_episodes_finish():
    runner = MultiAgentEnvRunner(config=two_agent_config(), worker_index=1)
    first = runner.sample(num_timesteps=30)
    ongoing = {episode.id_ for episode in first if not episode.is_done}
    second = runner.sample(num_timesteps=30)
    assert ongoing & {episode.id_ for episode in second}
    for episode in second:
        if episode.id_ in ongoing:
            assert episode.env_t_started > 0
    whole = runner.sample(num_episodes=3)
    assert len(whole) == 3
    assert all(episode.is_done for episode in whole)
    metrics = runner.get_metrics()
    assert metrics["episode_return_mean"].peek() > 0
    runner.stop()


@pytest.mark.timeout(RUNNER_TIMEOUT)
def test_state_roundtrip_with_rllibs_runner():
    config = two_agent_config()
    ours, theirs = (
        MultiAgentEnvRunner(config=config, worker_index=1),
        RLlibRunner(config=config, worker_index=1),
    )
    state = theirs.get_state()
    state[WEIGHTS_SEQ_NO] = 5
    ours.set_state(state)
    ours_state = ours.get_state()
    assert ours_state[WEIGHTS_SEQ_NO] == 5
    for module_id, weights in state[COMPONENT_RL_MODULE].items():
        for name, value in weights.items():
            np.testing.assert_array_equal(
                np.asarray(ours_state[COMPONENT_RL_MODULE][module_id][name]), np.asarray(value)
            )
    ours.stop()
    theirs.stop()


@pytest.mark.timeout(RUNNER_TIMEOUT)
def test_refuses_a_single_agent_config():
    config = PPOConfig().environment("CartPole-v1")
    with pytest.raises(ValueError, match=r"needs a multi-agent config .*SingleAgentEnvRunner"):
        MultiAgentEnvRunner(config=config, worker_index=1)


@pytest.mark.timeout(420)
@pytest.mark.usefixtures("no_leftover_children")
def test_ppo_trains_two_agents_through_our_runner():
    config = (
        two_agent_config()
        .env_runners(env_runner_cls=MultiAgentEnvRunner, num_env_runners=1)
        .training(train_batch_size_per_learner=400, minibatch_size=100, num_epochs=1)
    )
    algo = config.build_algo()
    try:
        for _ in range(2):
            result = algo.train()
        assert result[ENV_RUNNER_RESULTS][NUM_ENV_STEPS_SAMPLED_LIFETIME] >= 800
        names = algo.env_runner_group.foreach_env_runner(
            lambda runner: type(runner).__module__, local_env_runner=False
        )
        assert names == ["rlcollect.rllib.multi_agent"]
        assert SingleAgentEnvRunner.__module__ == "rlcollect.rllib.single_agent"
    finally:
        algo.stop()

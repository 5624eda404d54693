"""`rlcollect.rllib.SingleAgentEnvRunner` beside RLlib's own runner: the same `sample()`
contract (counts, chunks, ids, lookback, extra model outputs, modes), state, and real PPO
training with our class built locally and as a remote Ray actor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip(
    "ray.rllib",
    reason="RLlib is not importable: install the rllib extra (pip install 'rlcollect[rllib]')",
    exc_type=ImportError,
)

from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.connectors.env_to_module import MeanStdFilter
from ray.rllib.core import COMPONENT_ENV_TO_MODULE_CONNECTOR, COMPONENT_RL_MODULE
from ray.rllib.core.columns import Columns
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner as RLlibRunner
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

from rlcollect.rllib import SingleAgentEnvRunner

RUNNER_TIMEOUT = 300


class PipelineRunner(SingleAgentEnvRunner):
    """Ours with the fast path off: every step through RLlib's pipelines."""

    allow_fast_path = False


def cartpole_config(num_envs: int = 4, **env_runners: object) -> PPOConfig:
    return (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_envs_per_env_runner=num_envs, **env_runners)
    )


@pytest.fixture(params=[SingleAgentEnvRunner, PipelineRunner], ids=["fast", "pipelines"])
def runner_cls(request: pytest.FixtureRequest) -> type[SingleAgentEnvRunner]:
    return request.param


def steps_of(episodes: list) -> int:
    return sum(len(episode) for episode in episodes)


def build(cls: type, config: PPOConfig) -> object:
    return cls(config=config, worker_index=1)


# --- sample(): counts, chunks, continuation ----------------------------------------------------


@pytest.mark.timeout(RUNNER_TIMEOUT)
@pytest.mark.parametrize("num_envs", [1, 4])
def test_timestep_counts_are_at_least_n_and_fewer_than_n_plus_num_envs(runner_cls, num_envs):
    runner = build(runner_cls, cartpole_config(num_envs))
    assert runner.uses_fast_path is (runner_cls is SingleAgentEnvRunner)
    for n in (1, 7, 100, 203):
        episodes = runner.sample(num_timesteps=n)
        assert n <= steps_of(episodes) < n + num_envs
        for episode in episodes:
            episode.validate()
            assert len(episode) > 0
            # CartPole pays 1 per step: a chunk's return is its length.
            assert episode.get_return() == pytest.approx(len(episode))
    runner.stop()


@pytest.mark.timeout(RUNNER_TIMEOUT)
def test_ongoing_chunks_continue_with_the_same_id_t_started_and_lookback(runner_cls):
    runner = build(runner_cls, cartpole_config(4))
    first = runner.sample(num_timesteps=40)
    ongoing = {episode.id_: episode for episode in first if not episode.is_done}
    # At most one ongoing chunk per sub-env (none where an episode ended on the last step).
    assert 1 <= len(ongoing) <= 4
    second = runner.sample(num_timesteps=40)
    continued = [episode for episode in second if episode.id_ in ongoing]
    assert continued, "no chunk of the first call continues in the second"
    for chunk in continued:
        before = ongoing[chunk.id_]
        assert chunk.t_started == before.t_started + len(before)
        assert chunk.observations.lookback == 1
        # The chunk starts where the previous one ended; its lookback is the previous last step.
        np.testing.assert_array_equal(chunk.get_observations(0), before.get_observations(-1))
        np.testing.assert_array_equal(
            chunk.get_actions(-1, neg_index_as_lookback=True), before.get_actions(-1)
        )
    for episode in second:
        if episode.id_ not in ongoing:
            assert episode.t_started == 0
    runner.stop()


@pytest.mark.timeout(RUNNER_TIMEOUT)
def test_num_episodes_returns_that_many_whole_episodes(runner_cls):
    runner = build(runner_cls, cartpole_config(4))
    runner.sample(num_timesteps=10)
    episodes = runner.sample(num_episodes=5)
    assert len(episodes) == 5
    for episode in episodes:
        assert episode.is_done
        assert episode.is_terminated != episode.is_truncated
        assert episode.t_started == 0
        assert episode.observations.lookback == 0
        assert len(episode.get_observations()) == len(episode) + 1
    runner.stop()


@pytest.mark.timeout(RUNNER_TIMEOUT)
def test_force_reset_starts_every_episode_again(runner_cls):
    runner = build(runner_cls, cartpole_config(2))
    runner.sample(num_timesteps=10)
    episodes = runner.sample(num_timesteps=4, force_reset=True)
    assert all(episode.t_started == 0 for episode in episodes)
    runner.stop()


# --- what the episodes hold, beside RLlib's runner -----------------------------------------------


def column_layout(episode: object) -> dict[str, tuple]:
    """Each column's dtype and per-step shape (what a Learner's connectors read)."""
    layout = {
        "observations": episode.get_observations(),
        "actions": episode.get_actions(),
        "rewards": episode.get_rewards(),
    }
    layout.update(
        {key: episode.get_extra_model_outputs(key) for key in episode.extra_model_outputs}
    )
    return {
        key: (np.asarray(value).dtype, np.asarray(value).shape[1:]) for key, value in layout.items()
    }


@pytest.mark.timeout(RUNNER_TIMEOUT)
@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_episode_columns_match_rllibs_runner(runner_cls, env):
    config = PPOConfig().environment(env).env_runners(num_envs_per_env_runner=2)
    ours, theirs = build(runner_cls, config), build(RLlibRunner, config)
    ours_episodes, their_episodes = ours.sample(num_timesteps=60), theirs.sample(num_timesteps=60)
    assert column_layout(ours_episodes[0]) == column_layout(their_episodes[0])
    assert set(ours_episodes[0].extra_model_outputs) == {
        Columns.ACTION_DIST_INPUTS,
        Columns.ACTION_LOGP,
        WEIGHTS_SEQ_NO,
    }
    for episode in ours_episodes:
        assert episode.is_numpy
        assert isinstance(episode.get_infos(), list)
        # The episodes keep the distribution's actions; the env got them unsquashed / clipped
        # (Pendulum's raw Gaussian samples may lie outside its bounds, as with RLlib's runner).
        if env == "CartPole-v1":
            assert set(np.unique(episode.get_actions())) <= {0, 1}
    ours.stop()
    theirs.stop()


@pytest.mark.timeout(RUNNER_TIMEOUT)
def test_action_logp_is_the_log_probability_of_the_action(runner_cls):
    runner = build(runner_cls, cartpole_config(4))
    for episode in runner.sample(num_timesteps=200):
        logits = torch.as_tensor(episode.get_extra_model_outputs(Columns.ACTION_DIST_INPUTS))
        actions = torch.as_tensor(episode.get_actions()).long()
        expected = torch.log_softmax(logits, -1).gather(-1, actions[:, None])[:, 0]
        logp = torch.as_tensor(episode.get_extra_model_outputs(Columns.ACTION_LOGP))
        torch.testing.assert_close(logp, expected, rtol=1e-5, atol=1e-5)
    runner.stop()


@pytest.mark.timeout(RUNNER_TIMEOUT)
def test_explore_false_takes_the_greedy_action(runner_cls):
    runner = build(runner_cls, cartpole_config(4))
    for episode in runner.sample(num_timesteps=100, explore=False):
        logits = episode.get_extra_model_outputs(Columns.ACTION_DIST_INPUTS)
        np.testing.assert_array_equal(episode.get_actions(), logits.argmax(-1))
    runner.stop()


@pytest.mark.timeout(RUNNER_TIMEOUT)
def test_random_actions_fill_no_model_outputs(runner_cls):
    runner = build(runner_cls, cartpole_config(2))
    episodes = runner.sample(num_timesteps=30, random_actions=True)
    assert 30 <= steps_of(episodes) < 32
    assert set(episodes[0].extra_model_outputs) == {WEIGHTS_SEQ_NO}
    runner.stop()


@pytest.mark.timeout(RUNNER_TIMEOUT)
def test_exploration_actions_follow_the_module_distribution():
    """Our categorical sampler draws what RLlib's distribution would: over many steps of a
    fixed module the action frequencies match the softmax of the logits."""
    runner = build(SingleAgentEnvRunner, cartpole_config(8))
    episodes = runner.sample(num_timesteps=4000)
    logits = np.concatenate(
        [e.get_extra_model_outputs(Columns.ACTION_DIST_INPUTS) for e in episodes]
    )
    actions = np.concatenate([e.get_actions() for e in episodes])
    expected = torch.softmax(torch.as_tensor(logits), -1)[:, 1].mean().item()
    assert actions.mean() == pytest.approx(expected, abs=0.03)
    runner.stop()


# --- state, metrics, errors ---------------------------------------------------------------------


@pytest.mark.timeout(RUNNER_TIMEOUT)
def test_state_roundtrip_carries_weights_seq_no_and_counters(runner_cls):
    config = cartpole_config(2)
    theirs, ours = build(RLlibRunner, config), build(runner_cls, config)
    state = theirs.get_state()
    state[WEIGHTS_SEQ_NO] = 3
    state["num_env_steps_sampled_lifetime"] = 1234
    ours.set_state(state)
    assert ours.get_state()[WEIGHTS_SEQ_NO] == 3
    assert ours.num_env_steps_sampled_lifetime == 1234
    ours_weights = ours.get_state()[COMPONENT_RL_MODULE]
    for name, value in state[COMPONENT_RL_MODULE].items():
        np.testing.assert_array_equal(np.asarray(ours_weights[name]), np.asarray(value))
    # Same weights, same observation: the same greedy actions (explore=False).
    episodes = ours.sample(num_timesteps=20, explore=False)
    assert all((e.get_extra_model_outputs(WEIGHTS_SEQ_NO) == 3).all() for e in episodes)
    # An older sequence number does not overwrite newer weights.
    stale = theirs.get_state()
    stale[WEIGHTS_SEQ_NO] = 2
    first = next(iter(stale[COMPONENT_RL_MODULE]))
    stale[COMPONENT_RL_MODULE][first] = stale[COMPONENT_RL_MODULE][first] + 1.0
    ours.set_state(stale)
    np.testing.assert_array_equal(
        np.asarray(ours.get_state()[COMPONENT_RL_MODULE][first]),
        np.asarray(state[COMPONENT_RL_MODULE][first]),
    )
    ours.stop()
    theirs.stop()


@pytest.mark.timeout(RUNNER_TIMEOUT)
def test_metrics_count_steps_and_whole_episodes(runner_cls):
    runner = build(runner_cls, cartpole_config(2))
    lengths = {}
    for _ in range(6):
        for episode in runner.sample(num_timesteps=25):
            lengths[episode.id_] = lengths.get(episode.id_, 0) + len(episode)
            if episode.is_done:
                lengths[episode.id_] = (lengths[episode.id_], "done")
    metrics = runner.get_metrics()
    assert metrics["num_env_steps_sampled"].peek() >= 150
    finished = [length for length, *_ in (v for v in lengths.values() if isinstance(v, tuple))]
    assert finished
    # Whole-episode lengths: the chunks of each episode added up (CartPole: return = length).
    assert metrics["episode_len_mean"].peek() == pytest.approx(np.mean(finished[-50:]))
    assert metrics["episode_return_mean"].peek() == pytest.approx(np.mean(finished[-50:]))
    runner.stop()


@pytest.mark.timeout(RUNNER_TIMEOUT)
def test_user_connector_runs_with_its_state():
    config = cartpole_config(2).env_runners(
        env_to_module_connector=lambda env, spaces, device: MeanStdFilter()
    )
    runner = build(SingleAgentEnvRunner, config)
    assert not runner.uses_fast_path
    episodes = runner.sample(num_timesteps=50)
    assert 50 <= steps_of(episodes) < 52
    state = runner.get_state()[COMPONENT_ENV_TO_MODULE_CONNECTOR]
    assert state, "the MeanStdFilter's running statistics are part of the state"
    runner.stop()


@pytest.mark.timeout(RUNNER_TIMEOUT)
def test_sample_refuses_both_counts():
    runner = build(SingleAgentEnvRunner, cartpole_config(1))
    with pytest.raises(ValueError, match=r"num_timesteps=5 and num_episodes=1: give one of them"):
        runner.sample(num_timesteps=5, num_episodes=1)
    with pytest.raises(ValueError, match=r"num_timesteps=-1 is negative"):
        runner.sample(num_timesteps=-1)
    # RLlib's runners assert on these; code catching AssertionError still catches ours.
    with pytest.raises(AssertionError, match=r"give one of them"):
        runner.sample(num_timesteps=5, num_episodes=1)
    runner.stop()


@pytest.mark.timeout(RUNNER_TIMEOUT)
def test_a_failing_step_names_the_fault_tolerance_setting():
    config = cartpole_config(1)
    runner = build(SingleAgentEnvRunner, config)
    runner.sample(num_timesteps=2)
    runner.env.close()
    runner.env.step = lambda actions: (_ for _ in ()).throw(OSError("the simulator died"))
    with pytest.raises(RuntimeError, match=r"restart_failed_sub_environments=True"):
        runner.sample(num_timesteps=2)


class EpisodeEndRecorder(RLlibCallback):
    """Records, at each episode end, the episode's length over all its chunks."""

    lengths: list[tuple[int, int]] = []

    def on_episode_end(self, *, episode, prev_episode_chunks=None, **kwargs) -> None:
        earlier = sum(len(chunk) for chunk in prev_episode_chunks or [])
        self.lengths.append((earlier, len(episode)))


@pytest.mark.timeout(RUNNER_TIMEOUT)
def test_episode_callbacks_see_live_episodes_and_earlier_chunks():
    EpisodeEndRecorder.lengths = []
    config = cartpole_config(2).callbacks(EpisodeEndRecorder)
    runner = build(SingleAgentEnvRunner, config)
    assert not runner.uses_fast_path
    for _ in range(8):
        runner.sample(num_timesteps=10)
    assert EpisodeEndRecorder.lengths
    # Some episode spanned several 5-step chunks: its end sees the earlier ones.
    assert any(earlier > 0 for earlier, _ in EpisodeEndRecorder.lengths)
    runner.stop()

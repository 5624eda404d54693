"""RLlib's multi-agent door on the engine: an Algorithm's `MultiAgentEnvRunner` (local, and a
remote Ray actor) samples through the engine's `RolloutLoop` over a `DictAgentsEnv`; only that
engine env steps and resets the config's `MultiAgentEnv`s (RLlib's vector env is never
stepped); the episodes it hands RLlib are what RLlib's own runner hands out."""

from __future__ import annotations

import inspect

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip(
    "ray.rllib",
    reason="RLlib is not importable: install the rllib extra (pip install 'rlcollect[rllib]')",
    exc_type=ImportError,
)

from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.env.multi_agent_env import MultiAgentEnv
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner as RLlibRunner
from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

from rlcollect.rllib import MultiAgentEnvRunner
from tests.rllib.engine_door_checks import train_once_counting_loops

TIMEOUT = 420
EPISODE_LEN = 5


def policy_of(agent_id: int, *args: object, **kwargs: object) -> str:
    return f"p{agent_id}"


def two_agent_config() -> PPOConfig:
    return (
        PPOConfig()
        .environment(MultiAgentCartPole, env_config={"num_agents": 2})
        .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=policy_of)
    )


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.usefixtures("no_leftover_children")
@pytest.mark.parametrize("num_env_runners", [0, 1], ids=["local", "remote"])
def test_an_algorithms_multi_agent_runner_samples_through_the_engines_rollout_loop(
    num_env_runners, monkeypatch
):
    facts, collected = train_once_counting_loops(
        two_agent_config(), MultiAgentEnvRunner, num_env_runners, monkeypatch
    )
    assert len(facts) == 1
    assert facts[0]["sampler"] == "MultiAgentSampler"
    assert facts[0]["env"] == "DictAgentsEnv"
    assert facts[0]["loop"] == "rlcollect.collectors.rollout.RolloutLoop"
    assert facts[0]["batches"] >= 1
    # Locally, the loop's own collect() ran in this process, once per batch.
    assert len(collected) == (facts[0]["batches"] if num_env_runners == 0 else 0)


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("count_steps_by", ["env_steps", "agent_steps"])
def test_only_the_engines_env_steps_and_resets_the_multi_agent_envs(count_steps_by):
    config = (
        two_agent_config()
        .env_runners(num_envs_per_env_runner=2)
        .multi_agent(count_steps_by=count_steps_by)
    )
    runner = MultiAgentEnvRunner(config=config, worker_index=1)
    callers = set()

    def record_callers(target: object, names: tuple[str, ...]) -> None:
        for name in names:
            method = getattr(target, name)

            def recording(*args, _method=method, **kwargs):
                callers.add(inspect.getmodule(inspect.stack()[1].frame).__name__)
                return _method(*args, **kwargs)

            setattr(target, name, recording)

    record_callers(runner.env, ("step", "reset"))
    for sub_env in runner.env.envs:
        record_callers(sub_env, ("step", "reset"))
    counted = []
    for n in (1, 37, 100):
        episodes = runner.sample(num_timesteps=n)
        counted.append(sum(getattr(episode, count_steps_by)() for episode in episodes))
    finished = runner.sample(num_episodes=3)
    randomly = runner.sample(num_timesteps=10, random_actions=True)
    batches = runner._sampler.batches
    runner.stop()
    assert callers == {"rlcollect.envs.dict_agents"}
    # As RLlib's runner: the step that reaches the count is the last (a step of the 2 sub-envs
    # adds 2 env steps, or up to 4 agent steps).
    most = 2 if count_steps_by == "env_steps" else 4
    for n, got in zip((1, 37, 100), counted, strict=True):
        assert n <= got < n + most
    assert len(finished) == 3
    assert all(episode.is_done for episode in finished)
    assert sum(getattr(episode, count_steps_by)() for episode in randomly) >= 10
    assert batches >= 4


class TakeTurnsEnv(MultiAgentEnv):
    """Agents "a" and "b" act in turns ("a" first) in episodes of `EPISODE_LEN` steps,
    whatever the actions; observations, rewards and infos count the episode's steps, so every
    runner must hand out the same episodes."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__()
        self.agents = self.possible_agents = ["a", "b"]
        space = gym.spaces.Box(-1.0, 100.0, (1,), np.float32)
        self.observation_spaces = dict.fromkeys(self.agents, space)
        self.action_spaces = dict.fromkeys(self.agents, gym.spaces.Discrete(2))
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        self._t = 0
        return {"a": np.array([0.0], np.float32)}, {"a": {"t": 0, "reset": True}}

    def step(self, actions: dict) -> tuple:
        (agent,) = actions
        self._t += 1
        following = "b" if agent == "a" else "a"
        observations = {following: np.array([float(self._t)], np.float32)}
        done = self._t >= EPISODE_LEN
        rewards = {agent: float(self._t)}
        return (
            observations,
            rewards,
            {"__all__": done},
            {"__all__": False},
            {following: {"t": self._t}},
        )


def multi_agent_record(episodes: list) -> list[tuple]:
    return [
        (
            episode.env_steps(),
            episode.env_t_started,
            episode.is_done,
            {
                agent: (
                    np.asarray(agent_episode.get_observations()).ravel().tolist(),
                    agent_episode.get_infos(),
                    np.asarray(agent_episode.get_rewards()).tolist(),
                )
                for agent, agent_episode in sorted(episode.agent_episodes.items())
            },
        )
        for episode in episodes
    ]


@pytest.mark.timeout(TIMEOUT)
def test_turn_based_episodes_and_continuations_match_rllibs_runner():
    config = (
        PPOConfig()
        .environment(TakeTurnsEnv)
        .multi_agent(policies={"p"}, policy_mapping_fn=lambda agent, *args, **kwargs: "p")
        .env_runners(num_envs_per_env_runner=2)
    )
    records = {}
    for cls in (RLlibRunner, MultiAgentEnvRunner):
        runner = cls(config=config, worker_index=1)
        # Cuts mid-episode, an episode ending on a batch's last step, then whole episodes.
        samples = [runner.sample(num_timesteps=n) for n in (6, 14, 10)]
        samples.append(runner.sample(num_episodes=3))
        records[cls] = [multi_agent_record(sample) for sample in samples]
        runner.stop()
    assert records[MultiAgentEnvRunner] == records[RLlibRunner]
    first_episode = records[RLlibRunner][0][0]
    assert first_episode[3]["a"][1][0] == {"t": 0, "reset": True}

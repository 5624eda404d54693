"""RLlib's door on the engine: an Algorithm's runner (local, and a remote Ray actor) samples
through the engine's `RolloutLoop`; only the engine's env steps the vector env; the episodes it
hands RLlib (infos, observations, continuations) are what RLlib's own runner hands out."""

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
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner as RLlibRunner

from rlcollect.rllib import (
    EnvPoolBackend,
    GymVectorBackend,
    ParallelEnvBackend,
    SingleAgentEnvRunner,
)
from rlcollect.transforms import RewardSum
from tests.rllib.engine_door_checks import train_once_counting_loops

TIMEOUT = 420
EPISODE_LEN = 5


def has_envpool() -> bool:
    try:
        import envpool  # noqa: F401
    except ImportError:
        return False
    return True


BACKENDS = {
    "gymnasium": (GymVectorBackend, "GymVectorEnv"),
    "envpool": (EnvPoolBackend, "EnvPoolEnv"),
    # Sub-envs in worker processes, with an engine transform (its running return).
    "parallel": (lambda: ParallelEnvBackend(RewardSum), "TransformedEnv"),
}


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.usefixtures("no_leftover_children")
@pytest.mark.parametrize("num_env_runners", [0, 1], ids=["local", "remote"])
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_an_algorithms_runner_samples_through_the_engines_rollout_loop(
    backend, num_env_runners, monkeypatch
):
    if backend == "envpool" and not has_envpool():
        pytest.skip("envpool is not installed (the envpool extra)")
    make_backend, engine_env = BACKENDS[backend]
    runner_cls = SingleAgentEnvRunner.with_backend(make_backend())
    facts, collected = train_once_counting_loops(
        PPOConfig().environment("CartPole-v1"), runner_cls, num_env_runners, monkeypatch
    )
    assert len(facts) == 1
    assert facts[0]["sampler"] == "EngineSampler"
    assert facts[0]["env"] == engine_env
    if backend == "parallel":  # the transform runs in the engine's loop
        assert "episode_reward" in facts[0]["carrier_keys"]
    assert facts[0]["loop"] == "rlcollect.collectors.rollout.RolloutLoop"
    assert facts[0]["batches"] >= 1
    # Locally, the loop's own collect() ran in this process, once per batch.
    assert len(collected) == (facts[0]["batches"] if num_env_runners == 0 else 0)


class PipelineRunner(SingleAgentEnvRunner):
    """Ours with RLlib's pipelines on live episodes (the general path), still on the engine."""

    allow_fast_path = False


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("runner_cls", [SingleAgentEnvRunner, PipelineRunner])
def test_only_the_engines_env_steps_and_resets_the_vector_env(runner_cls):
    runner = runner_cls(
        config=PPOConfig().environment("CartPole-v1").env_runners(num_envs_per_env_runner=2),
        worker_index=1,
    )
    callers = set()
    vector_env = runner.env
    for name in ("step", "reset"):
        method = getattr(vector_env, name)

        def recording(*args, _method=method, **kwargs):
            callers.add(inspect.getmodule(inspect.stack()[1].frame).__name__)
            return _method(*args, **kwargs)

        setattr(vector_env, name, recording)
    runner.sample(num_timesteps=100)
    runner.sample(num_episodes=3)
    runner.sample(num_timesteps=10, random_actions=True)
    batches = runner._sampler.batches
    runner.stop()
    assert callers == {"rlcollect.envs.gym_vector"}
    # The steps samples' batches at least (an episodes sample's last batch may stop early,
    # once enough episodes finished, and is not counted).
    assert batches >= 2


class CountingInfoEnv(gym.Env):
    """Episodes of `EPISODE_LEN` steps whatever the action; observation and info count the
    steps of the episode, so every runner must hand out the same episodes."""

    observation_space = gym.spaces.Box(-1.0, 100.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, config: dict | None = None) -> None:
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self._t = 0
        return np.array([0.0], np.float32), {"t": 0, "reset": True}

    def step(self, action: int) -> tuple:
        self._t += 1
        observation = np.array([self._t], np.float32)
        return observation, 1.0, self._t >= EPISODE_LEN, False, {"t": self._t}


def episode_record(episodes: list) -> list[tuple]:
    return [
        (
            len(episode),
            episode.t_started,
            episode.is_done,
            np.asarray(episode.get_observations()).ravel().tolist(),
            episode.get_infos(),
        )
        for episode in episodes
    ]


@pytest.mark.timeout(TIMEOUT)
def test_episodes_infos_and_continuations_match_rllibs_runner():
    config = (
        PPOConfig()
        .environment(CountingInfoEnv, disable_env_checking=True)
        .env_runners(num_envs_per_env_runner=2)
    )
    records = {}
    for cls in (RLlibRunner, SingleAgentEnvRunner, PipelineRunner):
        runner = cls(config=config, worker_index=1)
        # Cuts mid-episode, an episode ending on a batch's last step, then whole episodes.
        samples = [runner.sample(num_timesteps=n) for n in (6, 14, 10)]
        samples.append(runner.sample(num_episodes=3))
        records[cls] = [episode_record(sample) for sample in samples]
        runner.stop()
    theirs = records[RLlibRunner]
    assert records[SingleAgentEnvRunner] == theirs
    assert records[PipelineRunner] == theirs
    # The infos are the env's own, step by step (a reset's first, then each step's).
    first_episode = theirs[0][0]
    assert first_episode[4][0] == {"t": 0, "reset": True}
    assert [info["t"] for info in first_episode[4]] == list(range(len(first_episode[4])))

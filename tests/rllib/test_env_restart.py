"""RLlib's env fault tolerance on our EnvRunners, beside RLlib's own runners: a real Gymnasium
(or RLlib multi-agent) env whose `step()` (or `reset()`) raises once. With
`restart_failed_sub_environments` the env is rebuilt and sampling goes on with RLlib's semantics
(the episodes finished before the failure are kept, the ongoing ones are dropped, the count
starts again); without it the env's error reaches the caller with the env's own traceback."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip(
    "ray.rllib",
    reason="RLlib is not importable: install the rllib extra (pip install 'rlcollect[rllib]')",
    exc_type=ImportError,
)

from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.env.env_errors import StepFailedRecreateEnvError
from ray.rllib.env.multi_agent_env import MultiAgentEnv
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner as RLlibMultiAgentRunner
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner as RLlibRunner

from rlcollect.rllib import MultiAgentEnvRunner, SingleAgentEnvRunner

RUNNER_TIMEOUT = 300
EPISODE_LEN = 10


class SimulatorCrashError(Exception):
    """What the flaky env raises."""


class FlakyEnv(gym.Env):
    """Episodes of exactly `EPISODE_LEN` steps (observation: the step within the episode). The
    `fail_step`-th call of `step()` (or the `fail_reset`-th of `reset()`), counted over every
    instance in this process, raises once, so the rebuilt env runs on."""

    observation_space = gym.spaces.Box(-1.0, 100.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)
    steps = 0
    resets = 0

    def __init__(self, config: dict | None = None) -> None:
        config = config or {}
        self._fail_step = config.get("fail_step")
        self._fail_reset = config.get("fail_reset")
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        FlakyEnv.resets += 1
        if FlakyEnv.resets == self._fail_reset:
            raise SimulatorCrashError(f"the simulator crashed in reset number {FlakyEnv.resets}")
        self._t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action: int) -> tuple:
        FlakyEnv.steps += 1
        if FlakyEnv.steps == self._fail_step:
            raise SimulatorCrashError(f"the simulator crashed in step number {FlakyEnv.steps}")
        self._t += 1
        return np.array([self._t], np.float32), 1.0, self._t >= EPISODE_LEN, False, {}


class PipelineRunner(SingleAgentEnvRunner):
    """Ours with the fast path off: every step through RLlib's pipelines."""

    allow_fast_path = False


RUNNERS = {
    "rllib": RLlibRunner,
    "ours-fast": SingleAgentEnvRunner,
    "ours-pipelines": PipelineRunner,
}


def flaky_config(num_envs: int, restart: bool, **fail: int) -> PPOConfig:
    return (
        PPOConfig()
        .environment(FlakyEnv, env_config=fail, disable_env_checking=True)
        .env_runners(num_envs_per_env_runner=num_envs)
        .fault_tolerance(restart_failed_sub_environments=restart)
    )


def build_and_count_from_zero(name: str, config: PPOConfig) -> object:
    runner = RUNNERS[name](config=config, worker_index=1)
    FlakyEnv.steps = FlakyEnv.resets = 0  # building may touch the env; count sampling only
    return runner


def layout(episodes: list) -> list[tuple[int, bool, int]]:
    """Each chunk's length, whether its episode ended, and its first step."""
    return [(len(episode), episode.is_done, episode.t_started) for episode in episodes]


def sample_twice(runner: Any, describe: Callable[[list], object]) -> dict[str, object]:
    """Sample 50 steps, then 20 (an env fails on the way), every chunk validated; whether the
    env was rebuilt, each sample `describe`d, the failures counted. The runner is stopped."""
    env_before = runner.env
    first = runner.sample(num_timesteps=50)
    rebuilt = runner.env is not env_before
    second = runner.sample(num_timesteps=20)
    for episode in first + second:
        episode.validate()
    facts = {
        "rebuilt": rebuilt,
        "first": describe(first),
        "second": describe(second),
        "step_failures": runner.get_metrics().get("num_env_step_failures"),
    }
    runner.stop()
    return facts


def counted_layout(episodes: list) -> list[tuple[int, bool, int]]:
    """`layout`, once every chunk is checked to be one episode's run of steps: its
    observations count them from t_started."""
    for episode in episodes:
        observations = np.asarray(episode.get_observations()).ravel()
        np.testing.assert_array_equal(
            observations, np.arange(len(observations)) + episode.t_started
        )
    return layout(episodes)


def sample_through_a_failure(name: str, num_envs: int, **fail: int) -> dict[str, object]:
    runner = build_and_count_from_zero(name, flaky_config(num_envs, True, **fail))
    return sample_twice(runner, counted_layout)


# The 25th step fails. With 1 env: 2 whole episodes before it, the third (4 steps in) dropped,
# then 50 steps from fresh resets: 5 whole episodes. With 2 envs: 12 steps of each before it (one
# whole episode each, 2 steps of the next dropped), then 25 steps of each: 2 whole episodes and
# an ongoing chunk of 5.
AFTER_A_FAILED_STEP = {
    1: [(EPISODE_LEN, True, 0)] * 7,
    2: [(EPISODE_LEN, True, 0)] * 6 + [(5, False, 0)] * 2,
}


@pytest.mark.timeout(RUNNER_TIMEOUT)
@pytest.mark.parametrize("num_envs", [1, 2])
def test_a_failed_step_rebuilds_the_env_and_sampling_goes_on_as_in_rllib(num_envs):
    facts = {name: sample_through_a_failure(name, num_envs, fail_step=25) for name in RUNNERS}
    assert facts["rllib"]["first"] == AFTER_A_FAILED_STEP[num_envs]
    assert facts["rllib"]["rebuilt"] is True
    assert facts["rllib"]["step_failures"] == 1
    for name in ("ours-fast", "ours-pipelines"):
        assert facts[name] == facts["rllib"], name


@pytest.mark.timeout(RUNNER_TIMEOUT)
def test_a_failed_reset_rebuilds_the_env_and_sampling_goes_on_as_in_rllib():
    # The 3rd reset (after the 2nd episode) fails: RLlib's runner meets it in the vector env's
    # autoreset (a failed step), ours in its masked reset; either way the finished episodes stay.
    facts = {name: sample_through_a_failure(name, 1, fail_reset=3) for name in RUNNERS}
    assert facts["rllib"]["first"] == [(EPISODE_LEN, True, 0)] * 7
    assert facts["rllib"]["step_failures"] == 1
    for name in ("ours-fast", "ours-pipelines"):
        assert facts[name] == facts["rllib"], name


@pytest.mark.timeout(RUNNER_TIMEOUT)
@pytest.mark.parametrize("name", list(RUNNERS))
def test_without_restart_the_envs_error_reaches_the_caller_with_its_traceback(name):
    runner = build_and_count_from_zero(name, flaky_config(2, False, fail_step=25))
    with pytest.raises(RuntimeError) as raised:
        runner.sample(num_timesteps=50)
    cause = raised.value.__cause__
    assert isinstance(cause, SimulatorCrashError)
    assert str(cause) == "the simulator crashed in step number 25"
    # The env's own frame, the line that raised, is in the traceback the caller gets.
    last = traceback.extract_tb(cause.__traceback__)[-1]
    assert (last.filename, last.name) == (__file__, "step")
    assert "raise SimulatorCrashError" in "".join(traceback.format_exception(raised.value))
    if name != "rllib":  # ours also says what failed where, and which setting would go on
        assert raised.match(
            r"env.step\(\) failed in \w+ \(worker_index=1\): SimulatorCrashError\('the simulator "
            r"crashed in step number 25'\)\. To rebuild the env and go on instead, set "
            r"config.fault_tolerance\(restart_failed_sub_environments=True\)\."
        )
    runner.stop()


class RecreateMeEnv(FlakyEnv):
    """Raises RLlib's `StepFailedRecreateEnvError` (an env's request for a quiet rebuild)."""

    def step(self, action: int) -> tuple:
        try:
            return super().step(action)
        except SimulatorCrashError as err:
            raise StepFailedRecreateEnvError(str(err)) from None


@pytest.mark.timeout(RUNNER_TIMEOUT)
@pytest.mark.parametrize("env_cls", [FlakyEnv, RecreateMeEnv], ids=["crash", "recreate-request"])
@pytest.mark.parametrize("name", ["ours-fast", "ours-pipelines"])
def test_a_rebuild_is_logged_unless_the_env_asked_for_it(name, env_cls, caplog):
    config = flaky_config(1, True, fail_step=5).environment(env_cls)
    runner = build_and_count_from_zero(name, config)
    with caplog.at_level("ERROR", logger="rlcollect.rllib"):
        episodes = runner.sample(num_timesteps=20)
    assert sum(len(episode) for episode in episodes) == 20  # all after the rebuild
    assert runner.get_metrics()["num_env_step_failures"] == 1
    logged = [record for record in caplog.records if record.name.startswith("rlcollect.rllib")]
    if env_cls is RecreateMeEnv:  # as RLlib's runners: no log for a requested rebuild
        assert logged == []
    else:
        assert len(logged) == 1
        assert "SimulatorCrashError: the simulator crashed" in logged[0].exc_text
    runner.stop()


# --- multi-agent -----------------------------------------------------------------------------


class FlakyMultiAgentEnv(MultiAgentEnv):
    """Two agents acting together in episodes of exactly `EPISODE_LEN` steps; the
    `fail_step`-th `step()` over every instance in this process raises once."""

    steps = 0

    def __init__(self, config: dict | None = None) -> None:
        super().__init__()
        self._fail_step = (config or {}).get("fail_step")
        self.agents = self.possible_agents = ["a", "b"]
        space = gym.spaces.Box(-1.0, 100.0, (1,), np.float32)
        self.observation_spaces = dict.fromkeys(self.agents, space)
        self.action_spaces = dict.fromkeys(self.agents, gym.spaces.Discrete(2))
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        self._t = 0
        return {agent: np.array([0.0], np.float32) for agent in self.agents}, {}

    def step(self, actions: dict) -> tuple:
        FlakyMultiAgentEnv.steps += 1
        if FlakyMultiAgentEnv.steps == self._fail_step:
            raise SimulatorCrashError(f"the simulator crashed in step number {self._t + 1}")
        self._t += 1
        observations = {agent: np.array([self._t], np.float32) for agent in self.agents}
        rewards = dict.fromkeys(self.agents, 1.0)
        done = {"__all__": self._t >= EPISODE_LEN}
        return observations, rewards, done, {"__all__": False}, {}


def sample_multi_agent_through_a_failure(cls: type) -> dict[str, object]:
    config = (
        PPOConfig()
        .environment(FlakyMultiAgentEnv, env_config={"fail_step": 25})
        .multi_agent(policies={"p"}, policy_mapping_fn=lambda agent, *args, **kwargs: "p")
        .env_runners(num_envs_per_env_runner=1)
        .fault_tolerance(restart_failed_sub_environments=True)
    )
    runner = cls(config=config, worker_index=1)
    FlakyMultiAgentEnv.steps = 0
    return sample_twice(
        runner,
        lambda episodes: [
            (e.env_steps(), e.agent_steps(), e.is_done, e.env_t_started) for e in episodes
        ],
    )


@pytest.mark.timeout(RUNNER_TIMEOUT)
def test_a_failed_multi_agent_step_rebuilds_the_env_and_sampling_goes_on_as_in_rllib():
    rllib = sample_multi_agent_through_a_failure(RLlibMultiAgentRunner)
    # 2 whole episodes before the failed 25th step, the third dropped, then 5 whole ones.
    assert rllib["first"] == [(EPISODE_LEN, 2 * EPISODE_LEN, True, 0)] * 7
    assert (rllib["rebuilt"], rllib["step_failures"]) == (True, 1)
    assert sample_multi_agent_through_a_failure(MultiAgentEnvRunner) == rllib


@pytest.mark.timeout(RUNNER_TIMEOUT)
@pytest.mark.parametrize("cls", [RLlibMultiAgentRunner, MultiAgentEnvRunner], ids=["rllib", "ours"])
def test_without_restart_a_multi_agent_envs_error_reaches_the_caller_with_its_traceback(cls):
    config = (
        PPOConfig()
        .environment(FlakyMultiAgentEnv, env_config={"fail_step": 5})
        .multi_agent(policies={"p"}, policy_mapping_fn=lambda agent, *args, **kwargs: "p")
    )
    runner = cls(config=config, worker_index=1)
    FlakyMultiAgentEnv.steps = 0
    with pytest.raises(RuntimeError) as raised:
        runner.sample(num_timesteps=20)
    cause = raised.value.__cause__
    assert isinstance(cause, SimulatorCrashError)
    last = traceback.extract_tb(cause.__traceback__)[-1]
    assert (last.filename, last.name) == (__file__, "step")
    if cls is MultiAgentEnvRunner:
        assert raised.match(r"env.step\(\) failed in MultiAgentEnvRunner \(worker_index=1\)")
    runner.stop()

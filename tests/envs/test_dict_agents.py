"""`DictAgentsEnv`: sub-envs whose agents come and go (dicts keyed by agent id, `"__all__"`
ending an episode) as an engine env: fixed-shape carrier columns (agents observed, team reward,
the `"__all__"` flags), the dicts in the step record per slot, staged or random actions, ended
sub-envs reset at once, seeded resets, and the engine's collector over it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlcollect import keys
from rlcollect.collectors import Collector
from rlcollect.envs.dict_agents import ALL, DictAgentsEnv
from rlcollect.envs.step_record import STEP
from rlcollect.testing import check_env

EPISODE_LEN = 3


class TakeTurns:
    """Agents "a" and "b" act in turns ("a" first), each observing the step count when its
    turn comes; the acting agent is rewarded 1 (plus its action, when `action_reward`);
    episodes last `EPISODE_LEN` steps. Records the actions it got and the seeds it was reset
    with; the `fail_at`-th step raises."""

    possible_agents = ["a", "b"]
    action_spaces = {"a": gym.spaces.Discrete(3), "b": gym.spaces.Discrete(3)}

    def __init__(self, action_reward: bool = False, fail_at: int | None = None) -> None:
        self.action_reward, self.fail_at = action_reward, fail_at
        self.t = self.steps = 0
        self.actions: list[dict] = []
        self.seeds: list[int | None] = []

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        self.seeds.append(seed)
        self.t = 0
        return {"a": np.array([0.0], np.float32)}, {"a": {"reset": True}}

    def step(self, actions: dict) -> tuple:
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError("the env failed")
        self.actions.append(dict(actions))
        (agent,) = actions
        self.t += 1
        following = "b" if agent == "a" else "a"
        reward = 1.0 + (float(actions[agent]) if self.action_reward else 0.0)
        done = self.t >= EPISODE_LEN
        observation = {following: np.array([float(self.t)], np.float32)}
        return observation, {agent: reward}, {ALL: done}, {ALL: False}, {agent: {"t": self.t}}

    def close(self) -> None:
        self.closed = True


def test_the_env_keeps_the_engines_contract() -> None:
    check_env(DictAgentsEnv([TakeTurns(), TakeTurns()]), steps=10)


def test_a_step_writes_counts_team_reward_and_all_flags_and_records_the_dicts() -> None:
    subs = [TakeTurns(action_reward=True), TakeTurns(action_reward=True)]
    env = DictAgentsEnv(subs)
    carrier = env.fake_tensordict().unsqueeze(1).expand(2, 4).clone()
    env.bind(carrier)
    env.reset_into(0)
    record = env.step_record
    assert carrier[keys.OBSERVATION][:, 0, 0].tolist() == [1, 1]
    assert record.root_observations[0][0] == {"a": np.array([0.0], np.float32)}
    assert record.root_infos[0][1] == {"a": {"reset": True}}
    for t, agent in enumerate(["a", "b", "a"]):
        env.set_actions([{agent: 2}, {agent: 0}])
        env.step_and_advance_into(t)
        assert record.actions[t] == [{agent: 2}, {agent: 0}]
        assert record.next_rewards[t] == [{agent: 3.0}, {agent: 1.0}]
        assert record.next_terminateds[t] == [{ALL: t == 2}] * 2
        assert record.next_infos[t] == [{agent: {"t": t + 1}}] * 2
    assert [sub.actions for sub in subs] == [
        [{"a": 2}, {"b": 2}, {"a": 2}],
        [{"a": 0}, {"b": 0}, {"a": 0}],
    ]
    next_td = carrier[keys.NEXT]
    assert next_td[keys.REWARD][:, :3, 0].tolist() == [[3.0, 3.0, 3.0], [1.0, 1.0, 1.0]]
    assert next_td[keys.DONE][:, :3, 0].tolist() == [[False, False, True]] * 2
    assert next_td[keys.TERMINATED][:, 2, 0].all()
    assert not next_td[keys.TRUNCATED].any()
    # The episode ended at slot 2: each sub-env was reset at once, into the root of slot 3.
    assert [sub.seeds for sub in subs] == [[None, None]] * 2
    assert record.root_infos[3] == [{"a": {"reset": True}}] * 2
    assert not carrier[keys.DONE][:, 3].any()
    assert record.phase is None
    assert record.last_step == 2


def test_without_staged_actions_only_the_agents_that_observed_act_at_random() -> None:
    subs = [TakeTurns(), TakeTurns()]
    env = DictAgentsEnv(subs)
    env.rollout(5, break_when_any_done=False)
    for sub in subs:
        assert [list(actions) for actions in sub.actions] == [["a"], ["b"], ["a"], ["a"], ["b"]]
        assert all(0 <= value < 3 for actions in sub.actions for value in actions.values())


def test_a_seeded_reset_seeds_each_sub_env_once() -> None:
    subs = [TakeTurns(), TakeTurns(), TakeTurns()]
    env = DictAgentsEnv(subs)
    env.seed_next_reset(7)
    env.reset()
    env.reset()
    assert [sub.seeds for sub in subs] == [[7, None], [8, None], [9, None]]


def test_a_failing_step_says_it_failed_stepping() -> None:
    env = DictAgentsEnv([TakeTurns(fail_at=2)])
    env.reset()
    env.step(env.rand_action(env.reset()))
    with pytest.raises(RuntimeError, match="the env failed"):
        env.step(env.rand_action(env.reset()))
    assert env.step_record.phase == STEP


def test_the_engines_collector_runs_it_and_counts_team_returns() -> None:
    subs = [TakeTurns(), TakeTurns()]
    collector = Collector(DictAgentsEnv(subs), None, frames_per_batch=12, total_frames=24)
    batches = list(collector)
    collector.shutdown()
    assert len(batches) == 2
    batch = batches[-1]
    assert batch.shape == torch.Size([2, 6])
    # Every step steps every sub-env: 12 steps of each, 4 whole episodes of EPISODE_LEN.
    assert [len(sub.actions) for sub in subs] == [12, 12]
    assert int(batch[keys.NEXT][keys.DONE].sum()) == 4
    assert batch[keys.NEXT][keys.REWARD].sum().item() == 12.0


def test_bad_arguments_name_the_value() -> None:
    with pytest.raises(ValueError, match=r"envs=\[\] holds no sub-env"):
        DictAgentsEnv([])
    env = DictAgentsEnv([TakeTurns(), TakeTurns()])
    with pytest.raises(ValueError, match=r"actions holds 1 dicts; give one per sub-env \(2\)"):
        env.set_actions([{}])
    env.close()
    assert all(sub.closed for sub in env.envs)

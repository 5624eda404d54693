"""`DictAgentsEnv`: sub-envs whose agents come and go, with dicts keyed by agent id for their
observations, actions, rewards, flags and infos (RLlib's `MultiAgentEnv` convention: the
`"__all__"` flag ends a sub-env's episode), as an engine env of batch `[num_envs]`.

The carrier holds fixed-shape tensors only, so it keeps per sub-env what is the same for every
such env: how many agents observed (`"observation"`: they act at the next step), the sum of the
agents' rewards (`"reward"`, so the engine's episode returns are the team's), and the
`"__all__"` flags (`"done"`, `"terminated"`, `"truncated"`). The dicts travel beside it in the
env's `AgentStepRecord`, per carrier slot: the observations and infos (root and next, as any
`StepRecord`), and each step's rewards, flags and actions.

A policy stages each step's action dicts with `set_actions` (one dict per sub-env, agent id ->
action) before the env steps; with none staged (the loop's random step) every agent that
observed acts at random from its action space. A sub-env whose episode ended is reset at once,
into the root of the next slot, so every step of a batch steps every sub-env.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.envs.base import EnvBase
from rlcollect.envs.specs import Categorical, Composite, Unbounded
from rlcollect.envs.step_record import RESET, STEP, StepRecord

# The flag that ends a sub-env's episode (RLlib's `MultiAgentEnv` convention).
ALL = "__all__"


class AgentStepRecord(StepRecord):
    """A `StepRecord` that also keeps, per slot and sub-env, what the step at that slot took
    and returned: `actions`, `next_rewards`, `next_terminateds`, `next_truncateds` (agent
    dicts; the flags with `"__all__"`). Observations are always kept."""

    STEP_COLUMNS = ("actions", "rewards", "terminateds", "truncateds")

    def __init__(self, num_envs: int) -> None:
        self._step_columns: dict[str, list[list[Any]]] = {name: [] for name in self.STEP_COLUMNS}
        super().__init__(num_envs, keep_observations=True)

    @property
    def actions(self) -> list[list[dict]]:
        return self._step_columns["actions"]

    @property
    def next_rewards(self) -> list[list[dict]]:
        return self._step_columns["rewards"]

    @property
    def next_terminateds(self) -> list[list[dict]]:
        return self._step_columns["terminateds"]

    @property
    def next_truncateds(self) -> list[list[dict]]:
        return self._step_columns["truncateds"]

    def bind(self, slots: int) -> None:
        if slots != len(self.root_infos):
            for name in self.STEP_COLUMNS:
                self._step_columns[name] = [
                    [{} for _ in range(self.num_envs)] for _ in range(slots)
                ]
        super().bind(slots)

    def record_agent_step(self, t: int, **columns: list[dict]) -> None:
        """The agent dicts of the step at `t` (`actions`, `rewards`, `terminateds`,
        `truncateds`: one dict per sub-env each)."""
        for name, per_env in columns.items():
            self._step_columns[name][t] = per_env


def default_action_space(env: Any, agent_id: Any) -> Any:
    """`agent_id`'s action space in `env`: `get_action_space(agent_id)` (RLlib), else
    `action_space(agent_id)` (PettingZoo), else `action_spaces[agent_id]`."""
    unwrapped = getattr(env, "unwrapped", env)
    if hasattr(unwrapped, "get_action_space"):
        return unwrapped.get_action_space(agent_id)
    if callable(getattr(unwrapped, "action_space", None)):
        return unwrapped.action_space(agent_id)
    return unwrapped.action_spaces[agent_id]


class DictAgentsEnv(EnvBase):
    """Sub-envs with agent dicts (see the module docstring) as an env of batch `[num_envs]`.

    Args:
        envs: the sub-envs (`reset(seed=, options=) -> (observations, infos)`,
            `step(actions) -> (observations, rewards, terminateds, truncateds, infos)`, each
            a dict keyed by agent id, the flags with `"__all__"`), or a vector of them (an
            object with `envs`, e.g. RLlib's `SyncVectorMultiAgentEnv`, whose sub-envs this
            env steps and resets itself; closing this env closes it).

    Keyword Args:
        max_agents: the most agents that act in one step of one sub-env (the range of the
            action slot; None: the first sub-env's `possible_agents`, else 1).
        action_space: `(sub-env, agent id) -> gym.Space`, for random actions
            (`default_action_space` when None).

    Examples:
        >>> import gymnasium as gym
        >>> class Pair:  # agent "a" observes every step, "b" only at the reset
        ...     possible_agents = ["a", "b"]
        ...     action_spaces = {"a": gym.spaces.Discrete(2), "b": gym.spaces.Discrete(2)}
        ...
        ...     def reset(self, seed=None, options=None):
        ...         return {"a": 0, "b": 0}, {}
        ...
        ...     def step(self, actions):
        ...         flags = {"__all__": False}
        ...         return {"a": 1}, {"a": 1.0, "b": 0.5}, flags, flags, {}
        ...
        ...     def close(self):
        ...         pass
        >>> env = DictAgentsEnv([Pair(), Pair()])
        >>> data = env.rollout(3, break_when_any_done=False)
        >>> data["next", "observation"][:, 0].ravel().tolist()  # agents that observed
        [1, 1]
        >>> data["next", "reward"][0, 0].item()
        1.5
        >>> env.step_record.next_observations[0][0]  # their observations
        {'a': 1}
        >>> env.close()
    """

    def __init__(
        self,
        envs: Sequence[Any] | Any,
        *,
        max_agents: int | None = None,
        action_space: Callable[[Any, Any], Any] | None = None,
    ) -> None:
        self._owner = None if isinstance(envs, Sequence) else envs
        self.envs = list(envs if self._owner is None else self._owner.envs)
        if not self.envs:
            raise ValueError(f"envs={envs!r} holds no sub-env; give at least one.")
        self.num_envs = len(self.envs)
        super().__init__(batch_size=(self.num_envs,), device="cpu")
        if max_agents is None:
            possible = getattr(
                getattr(self.envs[0], "unwrapped", self.envs[0]), "possible_agents", None
            )
            max_agents = max(len(possible or ()), 1)
        self.max_agents = max_agents
        self._action_space = action_space or default_action_space
        n = self.num_envs
        count = Unbounded(shape=(n, 1), dtype=torch.int64)
        self.observation_spec = Composite({keys.OBSERVATION: count}, shape=(n,))
        self.action_spec = Categorical(max_agents + 1, shape=(n, 1), dtype=torch.int64)
        self.reward_spec = Unbounded(shape=(n, 1), dtype=torch.float32)
        flag = Categorical(2, shape=(n, 1), dtype=torch.bool)
        self.done_spec = Composite(dict.fromkeys(keys.DONE_KEYS, flag), shape=(n,))
        self.step_record = AgentStepRecord(n)
        # The agents whose observation each sub-env gave last (they act next).
        self._observed: list[dict] = [{} for _ in range(n)]
        self._staged: list[dict] | None = None
        self._next_seed: int | None = None

    # --- what a policy hands in --------------------------------------------------------------

    def set_actions(self, actions: Sequence[dict]) -> None:
        """The action dicts (one per sub-env, agent id -> action) of the next step."""
        if len(actions) != self.num_envs:
            raise ValueError(
                f"actions holds {len(actions)} dicts; give one per sub-env ({self.num_envs})."
            )
        self._staged = list(actions)

    def random_actions(self) -> list[dict]:
        """A random action for every agent that observed, per sub-env."""
        return [
            {agent: self._action_space(env, agent).sample() for agent in observed}
            for env, observed in zip(self.envs, self._observed, strict=True)
        ]

    # --- buffer face --------------------------------------------------------------------------

    def _bind(self, carrier: TensorDictBase) -> None:
        if carrier.device is not None and carrier.device.type != "cpu":
            raise ValueError(
                f"DictAgentsEnv writes through NumPy views and needs a CPU carrier; got one on "
                f"{carrier.device}. Keep env_device='cpu' and set storing_device instead."
            )
        next_td = carrier.get(keys.NEXT)
        self._root_count = carrier.get(keys.OBSERVATION).numpy()
        self._next_count = next_td.get(keys.OBSERVATION).numpy()
        self._reward = next_td.get(keys.REWARD).numpy()
        self._root_flags = [carrier.get(name).numpy() for name in keys.DONE_KEYS]
        self._next_flags = [next_td.get(name).numpy() for name in keys.DONE_KEYS]
        self.step_record.bind(carrier.shape[-1])

    def reset_into(self, t: int, mask: torch.Tensor | None = None) -> None:
        self._check_open()
        selected = np.ones(self.num_envs, dtype=np.bool_)
        if mask is not None:
            selected = mask.reshape(self.num_envs).numpy(force=True).astype(np.bool_)
        record = self.step_record
        everyone = bool(selected.all())
        record.begin(RESET, masked=not everyone)
        seed = None
        if everyone:
            seed, self._next_seed = self._next_seed, None
        observations: list[Any] = [None] * self.num_envs
        infos: list[dict] = [{} for _ in range(self.num_envs)]
        for index in np.flatnonzero(selected):
            observation, info = self.envs[index].reset(
                seed=None if seed is None else seed + int(index), options=None
            )
            observations[index], infos[index] = observation, info
            self._observed[index] = observation
            self._root_count[index, t, 0] = len(observation)
        record.record_reset(t, infos, None if everyone else selected, observations)
        for flag in self._root_flags:
            flag[selected, t] = False

    def step_into(self, t: int) -> None:
        self._check_open()
        actions, self._staged = self._staged, None
        if actions is None:
            actions = self.random_actions()
        record = self.step_record
        started = record.begin(STEP)
        results = [env.step(action) for env, action in zip(self.envs, actions, strict=True)]
        observations, rewards, terminateds, truncateds, infos = (
            list(column) for column in zip(*results, strict=True)
        )
        record.record_step(t, infos, started, observations)
        record.record_agent_step(
            t, actions=actions, rewards=rewards, terminateds=terminateds, truncateds=truncateds
        )
        done_rows, terminated_rows, truncated_rows = self._next_flags
        for index in range(self.num_envs):
            observation = observations[index]
            self._observed[index] = observation
            self._next_count[index, t, 0] = len(observation)
            self._reward[index, t, 0] = sum(rewards[index].values())
            terminated = bool(terminateds[index].get(ALL, False))
            truncated = bool(truncateds[index].get(ALL, False))
            terminated_rows[index, t, 0] = terminated
            truncated_rows[index, t, 0] = truncated
            done_rows[index, t, 0] = terminated or truncated

    def advance_into(self, t: int) -> None:
        self._root_count[:, t + 1] = self._next_count[:, t]
        done = self._next_flags[0][:, t, 0]
        if done.any():
            self.reset_into(t + 1, torch.from_numpy(done.copy()))

    # --- protocol -----------------------------------------------------------------------------

    def seed_next_reset(self, seed: int | None) -> None:
        """The next reset of every sub-env is seeded (sub-env `i` gets `seed + i`)."""
        self._next_seed = seed

    def _set_seed(self, seed: int) -> int:
        self._next_seed = seed
        return seed + self.num_envs

    def close(self) -> None:
        if not self.is_closed:
            if self._owner is not None:
                self._owner.close()
            else:
                for env in self.envs:
                    env.close()
        super().close()

    def __repr__(self) -> str:
        return f"DictAgentsEnv(num_envs={self.num_envs}, max_agents={self.max_agents})"

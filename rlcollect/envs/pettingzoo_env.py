"""`PettingZooEnv`: a PettingZoo parallel env behind the env protocol, agents grouped.

Agents are grouped as TorchRL's PettingZoo wrapper groups them (by default by name: `agent_0`,
`agent_1` form the group `"agent"`), each group under its own key with an agent dim:
`(group, "observation")` is `[*B, n_agents, *obs_shape]`, `(group, "action")` `[*B, n_agents]`
(categorical) and, per agent, `(group, "reward")`, `done`, `terminated` and `truncated`
(`[*B, n_agents, 1]`). The env-level `done` / `terminated` / `truncated` (`[*B, 1]`) are set when
any agent's are (TorchRL's `done_on_any`, its default for parallel envs), and the env then
resets. Its buffer face writes each step straight into NumPy views of the carrier.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.envs.base import EnvBase
from rlcollect.envs.gym_spaces import spec_from_space
from rlcollect.envs.specs import Categorical, Composite, Unbounded

OBSERVATION, ACTION, REWARD = keys.OBSERVATION, keys.ACTION, keys.REWARD


def group_by_name(agents: Sequence[str]) -> dict[str, list[str]]:
    """TorchRL's default grouping of a parallel env: agents named `<group>_<int>` share the
    group `<group>`; any other agent is a group of its own."""
    groups: dict[str, list[str]] = {}
    for agent in agents:
        prefix, _, suffix = agent.rpartition("_")
        group = prefix if prefix and suffix.isdigit() else agent
        groups.setdefault(group, []).append(agent)
    return groups


def resolve_group_map(
    group_map: Mapping[str, Sequence[str]] | str | None, agents: Sequence[str]
) -> dict[str, list[str]]:
    """The group map asked for: None (by name), "all_in_one" (one group `"agents"`),
    "per_agent" (one group per agent) or an explicit `{group: [agents]}` covering every agent
    once."""
    if group_map is None:
        return group_by_name(agents)
    if group_map == "all_in_one":
        return {"agents": list(agents)}
    if group_map == "per_agent":
        return {agent: [agent] for agent in agents}
    if isinstance(group_map, str) or not isinstance(group_map, Mapping):
        raise ValueError(
            f"group_map must be None, 'all_in_one', 'per_agent' or a dict of group -> agents; "
            f"got {group_map!r}."
        )
    grouped = [agent for members in group_map.values() for agent in members]
    if sorted(grouped) != sorted(agents):
        raise ValueError(
            f"group_map {dict(group_map)} must name every agent of the env once; the env's "
            f"agents are {list(agents)}."
        )
    return {group: list(members) for group, members in group_map.items()}


class PettingZooEnv(EnvBase):
    """A PettingZoo `ParallelEnv` (an instance, or a callable making one) with grouped agents.

    Args:
        env: a `pettingzoo.ParallelEnv`, or a callable returning one (for worker processes).

    Keyword Args:
        group_map: how agents are grouped (see `resolve_group_map`); agents of one group must
            share their observation and action spaces.
        categorical_actions: integer actions for `Discrete` spaces (one-hot when False).
        seed: seeds the env at construction (`set_seed(seed)`).

    Examples:
        >>> from mpe2 import simple_spread_v3
        >>> env = PettingZooEnv(simple_spread_v3.parallel_env(N=3), seed=0)
        >>> env.group_map
        {'agent': ['agent_0', 'agent_1', 'agent_2']}
        >>> data = env.rollout(4)
        >>> data["agent", "observation"].shape, data["next", "agent", "reward"].shape
        (torch.Size([4, 3, 18]), torch.Size([4, 3, 1]))
        >>> env.close()
    """

    def __init__(
        self,
        env: Any,
        *,
        group_map: Mapping[str, Sequence[str]] | str | None = None,
        categorical_actions: bool = True,
        seed: int | None = None,
    ) -> None:
        super().__init__(batch_size=(), device="cpu")
        if callable(env) and not hasattr(env, "possible_agents"):
            env = env()
        if not all(hasattr(env, name) for name in ("possible_agents", "step", "reset")):
            raise TypeError(
                f"env must be a PettingZoo ParallelEnv (or a callable making one); got "
                f"{type(env).__name__}. For a turn-based (AEC) env, use its parallel_env() "
                "version where PettingZoo has one."
            )
        if type(self) is PettingZooEnv and hasattr(type(env), "agent_iter"):
            raise TypeError(
                "env is a turn-based PettingZoo env (AEC API); wrap it in PettingZooAECEnv, "
                "or pass its parallel_env() version here."
            )
        self._env = env
        # Stepped beneath PettingZoo's two checking wrappers (see `unchecked_parallel_env`);
        # their checks are made here, once per step.
        self._stepped = unchecked_parallel_env(env)
        self._action_spaces = {agent: env.action_space(agent) for agent in env.possible_agents}
        self._group_map = resolve_group_map(group_map, list(env.possible_agents))
        self._categorical = categorical_actions
        self._build_specs()
        if seed is not None:
            self.set_seed(seed)

    # --- specs --------------------------------------------------------------------------------

    def _group_spaces(self, group: str, members: list[str]) -> tuple[Any, Any]:
        env = self._env
        observation, action = env.observation_space(members[0]), env.action_space(members[0])
        for agent in members[1:]:
            if env.observation_space(agent) != observation or env.action_space(agent) != action:
                raise ValueError(
                    f"agents of group {group!r} must share their spaces; {agent!r} differs "
                    f"from {members[0]!r}. Pass group_map='per_agent' or a group_map that "
                    "keeps agents with different spaces apart."
                )
        return observation, action

    def _build_specs(self) -> None:
        observations = Composite(shape=self.batch_size)
        actions = Composite(shape=self.batch_size)
        rewards = Composite(shape=self.batch_size)
        flag = Categorical(2, shape=(1,), dtype=torch.bool)
        flags = Composite(dict.fromkeys(keys.DONE_KEYS, flag), shape=self.batch_size)
        self._action_readers: dict[str, Callable[[np.ndarray], Any]] = {}
        for group, members in self.group_map.items():
            count = len(members)
            observation_space, action_space = self._group_spaces(group, members)
            observations[(group, OBSERVATION)] = spec_from_space(observation_space).expand(count)
            action_spec = spec_from_space(action_space, self._categorical)
            actions[(group, ACTION)] = action_spec.expand(count)
            self._action_readers[group] = _action_reader(action_spec)
            rewards[(group, REWARD)] = Unbounded(shape=(count, 1), dtype=torch.float32)
            for name in keys.DONE_KEYS:
                flags[(group, name)] = flag.expand(count)
        self.observation_spec = observations
        self._full_action_spec = actions
        self.action_spec = actions
        self.reward_spec = rewards
        self.done_spec = flags

    @property
    def action_keys(self) -> list[Any]:
        return [(group, ACTION) for group in self.group_map]

    @property
    def reward_keys(self) -> list[Any]:
        return [(group, REWARD) for group in self.group_map]

    @property
    def full_action_spec(self) -> Composite:
        return self._full_action_spec

    def fake_tensordict(self) -> TensorDictBase:
        """A zero-filled transition whose groups have their agent dim as a batch dim."""
        frame = self.full_spec.zero()
        for group, members in self.group_map.items():
            batch = torch.Size([*self.batch_size, len(members)])
            for part in (frame, frame.get(keys.NEXT)):
                _set_batch(part.get(group), batch)
        return frame

    def _scratch_carrier(self) -> TensorDictBase:
        # The TensorDict face's one-step carrier, with the groups' agent dims kept.
        if self._scratch is None:
            frame = self.fake_tensordict()
            time_dim = len(self.batch_size)
            scratch = frame.unsqueeze(time_dim).expand(*self.batch_size, 2).clone()
            scratch.refine_names(*([None] * time_dim), keys.TIME_DIM_NAME)
            self._scratch = scratch
        return self._scratch

    @property
    def group_map(self) -> dict[str, list[str]]:
        return {group: list(members) for group, members in self._group_map.items()}

    @property
    def agents_per_step(self) -> int:
        """How many agents act at each env step (all of them, in a parallel env)."""
        return sum(len(members) for members in self.group_map.values())

    @property
    def pettingzoo_env(self) -> Any:
        """The PettingZoo env as it is stepped (beneath PettingZoo's checking wrappers when it
        had them, see `unchecked_parallel_env`): what to render or inspect."""
        return self._stepped

    # --- buffer face --------------------------------------------------------------------------

    def _bind(self, carrier: TensorDictBase) -> None:
        if carrier.device is not None and carrier.device.type != "cpu":
            raise ValueError(
                f"PettingZooEnv writes through NumPy views and needs a CPU carrier; got one on "
                f"{carrier.device}. Keep env_device='cpu' and set storing_device instead."
            )
        next_td = carrier.get(keys.NEXT)
        self._rows: list[_GroupRows] = []
        for group, members in self.group_map.items():
            self._rows.append(
                _GroupRows(
                    members=members,
                    read_action=self._action_readers[group],
                    root_observation=carrier.get((group, OBSERVATION)).numpy(),
                    next_observation=next_td.get((group, OBSERVATION)).numpy(),
                    action=carrier.get((group, ACTION)).numpy(),
                    reward=next_td.get((group, REWARD)).numpy(),
                    root_flags=[carrier.get((group, name)).numpy() for name in keys.DONE_KEYS],
                    next_flags=[next_td.get((group, name)).numpy() for name in keys.DONE_KEYS],
                    action_range=self._action_range(group, members),
                )
            )
        self._root_flags = [carrier.get(name).numpy() for name in keys.DONE_KEYS]
        self._next_flags = [next_td.get(name).numpy() for name in keys.DONE_KEYS]

    def reset_into(self, t: int, mask: torch.Tensor | None = None) -> None:
        self._check_open()
        if mask is not None and not bool(mask):
            return
        observations, _ = self._stepped.reset()
        for rows in self._rows:
            for index, agent in enumerate(rows.members):
                rows.root_observation[t, index] = observations[agent]
            for flag in rows.root_flags:
                flag[t] = False
        for flag in self._root_flags:
            flag[t] = False

    def step_into(self, t: int) -> None:
        self._check_open()
        alive = self._stepped.agents
        actions = {}
        for rows in self._rows:
            values = rows.action[t]
            for index, agent in enumerate(rows.members):
                if agent in alive:
                    actions[agent] = rows.read_action(values[index])
        if self._stepped is not self._env:
            self._check_actions(t, actions)
        observations, rewards, terminations, truncations, _ = self._stepped.step(actions)
        ended = terminated_any = truncated_any = False
        for rows in self._rows:
            members = rows.members
            if all(agent in observations for agent in members):
                rows.next_observation[t] = [observations[agent] for agent in members]
            else:  # an agent left earlier: it keeps its last observation
                for index, agent in enumerate(members):
                    source = observations.get(agent, rows.root_observation[t, index])
                    rows.next_observation[t, index] = source
            terminated = [bool(terminations.get(a, a not in alive)) for a in members]
            truncated = [bool(truncations.get(a, False)) for a in members]
            done = [x or y for x, y in zip(terminated, truncated, strict=True)]
            rows.reward[t, :, 0] = [rewards.get(agent, 0.0) for agent in members]
            done_rows, terminated_rows, truncated_rows = rows.next_flags
            done_rows[t, :, 0] = done
            terminated_rows[t, :, 0] = terminated
            truncated_rows[t, :, 0] = truncated
            ended, terminated_any = ended or any(done), terminated_any or any(terminated)
            truncated_any = truncated_any or any(truncated)
        done_flag, terminated_flag, truncated_flag = self._next_flags
        done_flag[t] = ended
        terminated_flag[t] = terminated_any
        truncated_flag[t] = truncated_any

    def _action_range(self, group: str, members: list[str]) -> tuple[int, int] | None:
        """`[low, high)` of a group's integer actions (`Discrete` spaces read as ints), which
        one vectorised comparison checks; None for other spaces."""
        space = self._action_spaces[members[0]]
        if self._action_readers[group] is not int or not isinstance(space, gym.spaces.Discrete):
            return None
        return int(space.start), int(space.start + space.n)

    def _check_actions(self, t: int, actions: Mapping[str, Any]) -> None:
        """What PettingZoo's `AssertOutOfBoundsWrapper` asserts, as a clear error: a group of
        integer actions in one comparison, other actions by their space's `contains`."""
        for rows in self._rows:
            if rows.action_range is not None:
                low, high = rows.action_range
                values = rows.action[t]
                if bool(((values >= low) & (values < high)).all()):
                    continue
            for agent in rows.members:
                action = actions.get(agent)
                space = self._action_spaces[agent]
                if agent in actions and not space.contains(action):
                    raise ValueError(
                        f"the action of {agent!r} is {action!r}, outside its action space "
                        f"{space}; the policy must write valid actions (e.g. sample from its "
                        "logits)."
                    )

    def advance_into(self, t: int) -> None:
        if self._next_flags[0][t, 0]:
            self.reset_into(t + 1)
            return
        for rows in self._rows:  # root flags are never set: nothing to clear
            rows.root_observation[t + 1] = rows.next_observation[t]

    # --- protocol -----------------------------------------------------------------------------

    def _set_seed(self, seed: int) -> int:
        # As GymEnv (and TorchRL's wrappers) do: a seeded reset now, later resets go on from it.
        self._stepped.reset(seed=seed)
        for agent in self._env.possible_agents:
            self._env.action_space(agent).seed(seed)
        return seed + 1

    def close(self) -> None:
        if not self.is_closed:
            self._env.close()
        super().close()


def _set_batch(tensordict: TensorDictBase, batch: torch.Size) -> None:
    """Give `tensordict` and the TensorDicts nested in it the batch size `batch`."""
    for value in tensordict.values():
        if isinstance(value, TensorDictBase):
            _set_batch(value, batch)
    tensordict.batch_size = batch


_CHECKING_WRAPPERS = ("OrderEnforcingWrapper", "AssertOutOfBoundsWrapper")


def unchecked_parallel_env(env: Any) -> Any:
    """`env`, or, when it is an AEC env converted to the parallel API (mpe2's, butterfly's,
    ...), the same env converted again from beneath PettingZoo's `OrderEnforcingWrapper` and
    `AssertOutOfBoundsWrapper`.

    Those two only check (reset before step; actions inside their spaces), and they do it
    through attribute forwarding that costs about a third of an MPE step. `PettingZooEnv`
    always resets before it steps and checks each action against its space itself, so the
    dynamics and the errors stay the same. Other wrappers (e.g. `TerminateIllegalWrapper`)
    change the game and are kept. The env given is not modified; both share the raw env.
    """
    aec = getattr(env, "aec_env", None)
    if type(env).__name__ != "aec_to_parallel_wrapper" or aec is None:
        return env
    inner = aec
    while type(inner).__name__ in _CHECKING_WRAPPERS:
        inner = inner.env
    if inner is aec:
        return env
    return type(env)(inner)


class _GroupRows:
    """The NumPy views of one group's entries in the bound carrier."""

    def __init__(self, **views: Any) -> None:
        self.members: list[str] = views["members"]
        self.read_action: Callable[[np.ndarray], Any] = views["read_action"]
        self.root_observation: np.ndarray = views["root_observation"]
        self.next_observation: np.ndarray = views["next_observation"]
        self.action: np.ndarray = views["action"]
        self.reward: np.ndarray = views["reward"]
        self.root_flags: list[np.ndarray] = views["root_flags"]
        self.next_flags: list[np.ndarray] = views["next_flags"]
        self.action_range: tuple[int, int] | None = views["action_range"]
        # The entries of a dict observation (whose rows are then a dict of arrays).
        self.observation_keys: list[str] | None = views.get("observation_keys")


def _action_reader(spec: Any) -> Callable[[np.ndarray], Any]:
    """How one agent's action row becomes what PettingZoo takes: an int for a categorical
    action, the index of the one for one-hot, the array otherwise."""
    if isinstance(spec, Categorical) and spec.shape == ():
        return int
    if type(spec).__name__ == "OneHot":
        return lambda row: int(np.argmax(row))
    return np.asarray

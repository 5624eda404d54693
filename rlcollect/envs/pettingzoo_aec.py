"""`PettingZooAECEnv`: a turn-based PettingZoo env (AEC API) behind the env protocol.

One env step is one agent's move: the agent PettingZoo selects acts, every agent is observed.
The layout follows TorchRL's PettingZoo wrapper with `use_mask=True`, so batches compare entry
for entry: one group per agent by default; per group `(group, "observation")` (a dict
observation stays a sub-TensorDict, without its action mask), `(group, "action_mask")`
(`[n, n_actions]` bool: the acting agent's legal moves, all True for the others),
`(group, "mask")` (`[n]` bool: True for the agent that acts at this step), the action, the
reward and the flags. The env-level flags are set when every agent's are (TorchRL's default for
AEC envs), and the env then resets. Only the acting agent's action is used; a policy should
read `"mask"` and `"action_mask"`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.envs.gym_spaces import spec_from_space
from rlcollect.envs.pettingzoo_env import PettingZooEnv
from rlcollect.envs.specs import Categorical, Composite, Unbounded

ACTION_MASK, MASK = "action_mask", "mask"


class PettingZooAECEnv(PettingZooEnv):
    """A PettingZoo `AECEnv` (an instance, or a callable making one), one agent's move per step.

    Keyword Args:
        group_map: as for `PettingZooEnv`; one group per agent by default (TorchRL's default
            for turn-based envs).
        categorical_actions: integer actions for `Discrete` spaces (one-hot when False).
        seed: seeds the env at construction.

    Examples:
        >>> import torch
        >>> from pettingzoo.classic import tictactoe_v3
        >>> env = PettingZooAECEnv(tictactoe_v3.env(), seed=0)
        >>> _ = torch.manual_seed(0)  # the random moves (an illegal one ends the game)
        >>> data = env.rollout(3)
        >>> data["player_1", "mask"].flatten().tolist()  # player_1 moves first, then turns
        [True, False, True]
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
        if callable(env) and not hasattr(env, "possible_agents"):
            env = env()
        if not all(hasattr(type(env), name) for name in ("last", "observe", "agent_iter")):
            raise TypeError(
                f"env must be a PettingZoo AECEnv (or a callable making one); got "
                f"{type(env).__name__}. A parallel env goes in PettingZooEnv."
            )
        super().__init__(
            env,
            group_map="per_agent" if group_map is None else group_map,
            categorical_actions=categorical_actions,
            seed=seed,
        )

    def _observation_spec(self, space: Any) -> Any:
        if hasattr(space, "spaces") and ACTION_MASK in space.spaces:
            rest = {name: sub for name, sub in space.spaces.items() if name != ACTION_MASK}
            return Composite({name: spec_from_space(sub) for name, sub in rest.items()})
        return spec_from_space(space)

    def _build_specs(self) -> None:
        super()._build_specs()
        self._masked = {}
        for group, members in self.group_map.items():
            space = self._env.observation_space(members[0])
            observation = self._observation_spec(space)
            count = len(members)
            self.observation_spec[(group, keys.OBSERVATION)] = observation.expand(count)
            flag = Categorical(2, shape=(count,), dtype=torch.bool)
            self.observation_spec[(group, MASK)] = flag
            self._masked[group] = hasattr(space, "spaces") and ACTION_MASK in space.spaces
            if self._masked[group]:
                actions = int(self._env.action_space(members[0]).n)
                legal = Categorical(2, shape=(count, actions), dtype=torch.bool)
                self.observation_spec[(group, ACTION_MASK)] = legal
        self.reward_spec = Composite(shape=self.batch_size)
        for group, members in self.group_map.items():
            self.reward_spec[(group, keys.REWARD)] = Unbounded(
                shape=(len(members), 1), dtype=torch.float32
            )

    @property
    def agents_per_step(self) -> int:
        """One agent moves per step."""
        return 1

    # --- buffer face --------------------------------------------------------------------------

    def _bind(self, carrier: TensorDictBase) -> None:
        super()._bind(carrier)
        next_td = carrier.get(keys.NEXT)
        self._places: dict[str, tuple[int, int]] = {}
        self._extra_rows = []
        for group_index, (group, members) in enumerate(self.group_map.items()):
            for index, agent in enumerate(members):
                self._places[agent] = (group_index, index)
            views = {
                "root_mask": carrier.get((group, MASK)).numpy(),
                "next_mask": next_td.get((group, MASK)).numpy(),
                "root_legal": None,
                "next_legal": None,
            }
            if self._masked[group]:
                views["root_legal"] = carrier.get((group, ACTION_MASK)).numpy()
                views["next_legal"] = next_td.get((group, ACTION_MASK)).numpy()
            self._extra_rows.append(views)
            self._rows[group_index].observation_keys = _leaf_keys(
                carrier.get((group, keys.OBSERVATION))
            )

    def _observe_all(self, t: int, root: bool) -> None:
        """Every agent's observation, which agent acts next and its legal moves, at `t`."""
        env = self._env
        acting = env.agent_selection
        for rows, extra in zip(self._rows, self._extra_rows, strict=True):
            observations = rows.root_observation if root else rows.next_observation
            mask = extra["root_mask" if root else "next_mask"]
            legal = extra["root_legal" if root else "next_legal"]
            for index, agent in enumerate(rows.members):
                value = env.observe(agent)
                is_acting = agent == acting
                mask[t, index] = is_acting
                if legal is not None:
                    legal[t, index] = value[ACTION_MASK] if is_acting else True
                _write_observation(observations, rows.observation_keys, t, index, value)

    def reset_into(self, t: int, mask: torch.Tensor | None = None) -> None:
        self._check_open()
        if mask is not None and not bool(mask):
            return
        self._env.reset()
        self._observe_all(t, root=True)
        for rows in self._rows:
            for flag in rows.root_flags:
                flag[t] = False
        for flag in self._root_flags:
            flag[t] = False

    def step_into(self, t: int) -> None:
        self._check_open()
        env = self._env
        agent = env.agent_selection
        group_index, index = self._places[agent]
        rows = self._rows[group_index]
        if env.terminations[agent] or env.truncations[agent]:
            env.step(None)  # PettingZoo's "dead step" for an agent that is done
        else:
            env.step(rows.read_action(rows.action[t, index]))
        self._observe_all(t, root=False)
        every = [True, True, True]  # done, terminated, truncated: every agent's
        for rows in self._rows:
            done_rows, terminated_rows, truncated_rows = rows.next_flags
            for position, member in enumerate(rows.members):
                terminated = bool(env.terminations.get(member, True))
                truncated = bool(env.truncations.get(member, False))
                rows.reward[t, position] = env.rewards.get(member, 0.0)
                terminated_rows[t, position] = terminated
                truncated_rows[t, position] = truncated
                done_rows[t, position] = terminated or truncated
                every[0] &= terminated or truncated
                every[1] &= terminated
                every[2] &= truncated
        for flag, value in zip(self._next_flags, every, strict=True):
            flag[t] = value

    def advance_into(self, t: int) -> None:
        if self._next_flags[0][t, 0]:
            self.reset_into(t + 1)
            return
        for rows, extra in zip(self._rows, self._extra_rows, strict=True):
            _copy_observation(rows, t)
            extra["root_mask"][t + 1] = extra["next_mask"][t]
            if extra["root_legal"] is not None:
                extra["root_legal"][t + 1] = extra["next_legal"][t]
            for flag in rows.root_flags:  # an agent done before the others stays done
                flag[t + 1] = False


def _copy_observation(rows: Any, t: int) -> None:
    """Root observation at `t + 1` = next observation at `t` (a dict: entry by entry)."""
    if rows.observation_keys is None:
        rows.root_observation[t + 1] = rows.next_observation[t]
        return
    for name in rows.observation_keys:
        rows.root_observation[name][t + 1] = rows.next_observation[name][t]


def _leaf_keys(observation: Any) -> list[str] | None:
    """The entries of a dict observation (None for a plain tensor)."""
    if isinstance(observation, torch.Tensor):
        return None
    return list(observation.keys())


def _write_observation(rows: Any, names: list[str] | None, t: int, index: int, value: Any) -> None:
    if names is None:
        rows[t, index] = value
        return
    for name in names:
        rows[name][t, index] = np.asarray(value[name])

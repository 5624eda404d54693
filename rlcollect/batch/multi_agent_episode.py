"""`AgentEpisodes`: one env episode of a multi-agent env read as one `Episode` per agent, as
RLlib's `MultiAgentEpisode` holds one `SingleAgentEpisode` per agent (named apart from RLlib's
class; `MultiAgentEpisode`, its earlier name here, still imports from `rlcollect`).

A multi-agent env groups its agents under group keys with an agent dim (`("agent",
"observation")` is `[T, n_agents, ...]`; with `policies=`, one sub-batch per policy id), next to
the env-level flags and trajectory ids. Agent `i` of group `g` has the id `(g, i)`: the batch
holds no agent names, and `env.group_map[g][i]` names it (e.g. `"agent_1"` for `("agent", 1)`
in mpe2's simple_spread). Its episode reads the group's entries at index `i` as its own
(`"observation"`, `"action"`, `("next", "reward")` and its own flags where the group has them),
with the env-level entries (trajectory ids, the env's flags) where it has none.
"""

from __future__ import annotations

from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.batch.episodes import Episode

AgentId = tuple[str, int]


def agent_groups(transitions: TensorDictBase) -> list[str]:
    """The group keys of `transitions` (`[T]`): sub-TensorDicts with one more (agent) dim, at
    the root or under `"next"`; empty for a single-agent env."""
    found: list[str] = []
    for td in (transitions, transitions.get(keys.NEXT, None)):
        if td is None:
            continue
        for name, value in td.items():
            is_group = isinstance(value, TensorDictBase) and value.batch_dims == td.batch_dims + 1
            if is_group and name not in (keys.NEXT, keys.COLLECTOR) and name not in found:
                found.append(name)
    return found


def agent_transitions(
    transitions: TensorDictBase, groups: list[str], group: str, index: int
) -> TensorDictBase:
    """The `[T]` transitions of agent `index` of `group`: the env-level entries, with the
    agent's own entries (root and `"next"`) in place of any of the same name."""
    own = transitions.exclude(*groups, *[(keys.NEXT, name) for name in groups])
    for prefix in ((), (keys.NEXT,)):
        entries = transitions.get((*prefix, group), None)
        if entries is None:
            continue
        for key, value in entries[:, index].items(include_nested=True, leaves_only=True):
            own.set((*prefix, *keys.as_tuple_key(key)), value)
    return own


class AgentEpisodes:
    """One env episode (or chunk of one) of a multi-agent env: one `Episode` per agent.

    Args:
        episode: the env-level episode (or chunk), over the grouped `[T]` transitions.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> agents = TensorDict({"observation": torch.zeros(2, 3, 4)}, batch_size=[2, 3])
        >>> next_agents = TensorDict(
        ...     {"observation": torch.ones(2, 3, 4), "reward": torch.ones(2, 3, 1)},
        ...     batch_size=[2, 3],
        ... )
        >>> transitions = TensorDict(
        ...     {
        ...         "agent": agents,
        ...         "collector": {"traj_ids": torch.zeros(2, dtype=torch.int64)},
        ...         "next": {"agent": next_agents, "terminated": torch.tensor([[False], [True]])},
        ...     },
        ...     batch_size=[2],
        ... )
        >>> episode = AgentEpisodes(Episode(transitions))
        >>> episode.agent_ids
        [('agent', 0), ('agent', 1), ('agent', 2)]
        >>> episode.agent_episodes["agent", 1].get_observations().shape
        torch.Size([3, 4])
        >>> episode.get_return(), episode.is_terminated
        (6.0, True)
    """

    def __init__(self, episode: Episode) -> None:
        self.env_episode = episode
        transitions = episode.transitions
        groups = agent_groups(transitions)
        self.agent_episodes: dict[AgentId, Episode] = {
            (group, index): Episode(
                agent_transitions(transitions, groups, group, index), episode.t_started
            )
            for group in groups
            for index in range(_group_size(transitions, group))
        }

    @property
    def agent_ids(self) -> list[AgentId]:
        """`(group, index)` of every agent, group by group, in the group's order."""
        return list(self.agent_episodes)

    @property
    def id_(self) -> int:
        """The trajectory id the collector gave the env episode (its agents' too)."""
        return self.env_episode.id_

    @property
    def t_started(self) -> int:
        """The env step at which this chunk starts (0: from the env's reset)."""
        return self.env_episode.t_started

    @property
    def t(self) -> int:
        """The env step after the last one held."""
        return self.env_episode.t

    def __len__(self) -> int:
        """The env steps held (each agent's episode holds as many)."""
        return len(self.env_episode)

    def get_return(self) -> float:
        """The undiscounted sum of every agent's rewards (RLlib's `get_return()`)."""
        return sum(episode.get_return() for episode in self.agent_episodes.values())

    @property
    def is_terminated(self) -> bool:
        """Whether the env episode ended in a terminal state (env-level flag)."""
        return self.env_episode.is_terminated

    @property
    def is_truncated(self) -> bool:
        """Whether the env episode was cut (env-level flag)."""
        return self.env_episode.is_truncated

    @property
    def is_done(self) -> bool:
        """Whether the env episode ended here; False for a chunk of one that goes on."""
        return self.env_episode.is_done

    def __repr__(self) -> str:
        return (
            f"AgentEpisodes(id_={self.id_}, t_started={self.t_started}, len={len(self)}, "
            f"agents={len(self.agent_episodes)}, return={self.get_return():.4g}, "
            f"terminated={self.is_terminated}, truncated={self.is_truncated})"
        )


def _group_size(transitions: TensorDictBase, group: str) -> int:
    entries = transitions.get(group, None)
    if entries is None:
        entries = transitions.get((keys.NEXT, group))
    return int(entries.shape[transitions.batch_dims])

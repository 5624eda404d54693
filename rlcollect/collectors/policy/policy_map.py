"""`PolicyMap`: one policy per team of agents (RLlib's `policies` + `policy_mapping_fn`).

A multi-agent env groups its agents under group keys with an agent dim (`group_map`). The
map sends each agent to a policy id with `policy_mapping_fn(agent_id)`; at every step each
policy is called once, on a TensorDict of all its agents (`[*env_batch, n_agents]`, keys as
under a group: `"observation"` in, `"action"` out). When a policy's agents are exactly one
group, the group's own TensorDict is handed over (no copy); otherwise its agents are gathered
from their groups and its outputs scattered back.

Collected batches then hold one sub-batch per policy id (RLlib's `MultiAgentBatch`): the
entries of the policy's agents under `policy_id` and `("next", policy_id)`, agents in the
order of `policy_agents[policy_id]`, next to the env-level flags and trajectory ids. When the
policies are the groups, that is the env's own layout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from rlcollect import keys
from rlcollect.collectors.policy.resolve import resolve_policy

NestedKey = str | tuple[str, ...]
_RESERVED_IDS = frozenset({keys.NEXT, keys.COLLECTOR, *keys.DONE_KEYS, keys.POLICY_VERSION})


@dataclass(frozen=True)
class Route:
    """Where one policy's agents live: `(group, agent indices)` segments, in order."""

    segments: tuple[tuple[str, torch.Tensor], ...]
    whole_group: str | None  # set when the agents are exactly one group, in its order

    @property
    def num_agents(self) -> int:
        return sum(len(index) for _, index in self.segments)


def _checked_policies(policies: Any) -> dict[str, Any]:
    if not isinstance(policies, Mapping) or not policies:
        raise TypeError(
            f"policies must be a non-empty dict of policy id -> policy module; got {policies!r}."
        )
    for policy_id in policies:
        if not isinstance(policy_id, str) or policy_id in _RESERVED_IDS or "." in policy_id:
            raise ValueError(
                f"policy id {policy_id!r} cannot name a sub-batch; use a string other than "
                f"{sorted(_RESERVED_IDS)}, without dots."
            )
    return dict(policies)


def _one_policy_mapping(policy_id: str) -> Callable[[str], str]:
    return lambda agent_id: policy_id


class PolicyMap(nn.Module):
    """Runs one policy per policy id over the agents `policy_mapping_fn` sends it.

    Args:
        policies: policy id -> a TensorDict module reading and writing keys as under a group
            (`"observation"` -> `"action"`, plus e.g. `"sample_log_prob"`), or an `nn.Module`
            whose forward names the observation keys (wrapped to write `"action"`).
        policy_mapping_fn: agent id -> policy id; may be left out with a single policy.

    The map is bound to an env (`bind`) by the collector that runs it; `policy_agents` then
    names each policy's agents in the order of its sub-batch's agent dim. Its weights are
    those of its policies under `"policies.<policy_id>."`.

    Examples:
        >>> from mpe2 import simple_tag_v3
        >>> from rlcollect import Collector
        >>> from rlcollect.envs import PettingZooEnv
        >>> class Greedy(torch.nn.Module):  # reads each agent's "observation"
        ...     def __init__(self, observation_size):
        ...         super().__init__()
        ...         self.net = torch.nn.Linear(observation_size, 5)
        ...     def forward(self, observation):
        ...         return self.net(observation).argmax(-1)
        >>> env = PettingZooEnv(simple_tag_v3.parallel_env(), seed=0)
        >>> collector = Collector(
        ...     env,
        ...     policies={"predator": Greedy(16), "prey": Greedy(14)},
        ...     policy_mapping_fn=lambda agent: "prey" if agent.startswith("agent") else "predator",
        ...     frames_per_batch=10,
        ... )
        >>> batch = collector.next()
        >>> batch["predator", "action"].shape, batch["next", "prey", "reward"].shape
        (torch.Size([10, 3]), torch.Size([10, 1, 1]))
        >>> collector.shutdown()
    """

    def __init__(
        self,
        policies: Mapping[str, Any],
        policy_mapping_fn: Callable[[str], str] | None = None,
    ) -> None:
        super().__init__()
        given = _checked_policies(policies)
        if policy_mapping_fn is None:
            if len(given) != 1:
                raise TypeError(
                    f"policy_mapping_fn is needed to choose among the policies {sorted(given)}; "
                    "pass a function agent_id -> policy id."
                )
            policy_mapping_fn = _one_policy_mapping(next(iter(given)))
        if not callable(policy_mapping_fn):
            raise TypeError(
                f"policy_mapping_fn must be a callable agent_id -> policy id; got "
                f"{policy_mapping_fn!r}."
            )
        self._given = given
        self.policy_mapping_fn = policy_mapping_fn
        self.policies = nn.ModuleDict(
            {pid: policy for pid, policy in given.items() if isinstance(policy, nn.Module)}
        )
        self._callables: dict[str, Any] = {}
        self.routes: dict[str, Route] = {}
        self.policy_agents: dict[str, list[str]] = {}
        self._groups: list[str] = []

    # --- binding to an env's groups -------------------------------------------------------------

    def bind(self, env: Any) -> PolicyMap:
        """Route every agent of `env` to its policy and resolve each policy on the keys of
        its agents' group. Returns the map.

        Raises:
            ValueError: the env has no agent groups, an agent maps to an unknown policy id, a
                policy gets no agent, or one policy's agents have different entries.
        """
        group_map = env.group_map
        if not group_map:
            raise ValueError(
                f"policies= runs one policy per team of agents, but {type(env).__name__} has no "
                "agent groups (group_map is empty); pass policy= for a single-agent env."
            )
        assigned = self._assign(group_map)
        self.routes = {pid: _route(assigned[pid], group_map) for pid in self._given}
        self.policy_agents = {
            pid: [group_map[group][int(i)] for group, index in route.segments for i in index]
            for pid, route in self.routes.items()
        }
        self._groups = list(group_map)
        for pid, route in self.routes.items():
            self._resolve(pid, route, env)
        return self

    def _assign(self, group_map: Mapping[str, Sequence[str]]) -> dict[str, list[tuple[str, int]]]:
        assigned: dict[str, list[tuple[str, int]]] = {pid: [] for pid in self._given}
        for group, agents in group_map.items():
            for index, agent in enumerate(agents):
                pid = self.policy_mapping_fn(agent)
                if pid not in assigned:
                    raise ValueError(
                        f"policy_mapping_fn({agent!r}) returned {pid!r}, which is not a policy "
                        f"id; the policies are {sorted(self._given)}."
                    )
                assigned[pid].append((group, index))
        idle = sorted(pid for pid, agents in assigned.items() if not agents)
        if idle:
            raise ValueError(
                f"policy_mapping_fn sends no agent to the policies {idle}; every policy needs "
                "agents (drop the unused ones from policies=)."
            )
        return assigned

    def _resolve(self, pid: str, route: Route, env: Any) -> None:
        groups = [group for group, _ in route.segments]
        layouts = {group: _entry_layout(env, group) for group in groups}
        if len({tuple(layout.items()) for layout in layouts.values()}) > 1:
            raise ValueError(
                f"policy {pid!r} acts for agents of the groups {groups}, whose entries differ "
                f"({layouts}); map agents with different observations or actions to different "
                "policies."
            )
        observation_keys = [key for key in layouts[groups[0]] if key != keys.ACTION]
        # The weights stay those of the module given (a plain module's wrapper is not
        # registered), so that they have the same names before and after binding.
        self._callables[pid] = resolve_policy(self._given[pid], observation_keys, [keys.ACTION])

    # --- the step -------------------------------------------------------------------------------

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Call each policy once on its agents' entries of `tensordict` (a step's root, with
        the groups under their keys) and write its outputs to those agents."""
        if not self.routes:
            raise RuntimeError("PolicyMap is not bound to an env; a collector binds it.")
        for pid, route in self.routes.items():
            policy = self._callables[pid]
            if route.whole_group is not None:
                group = tensordict.get(route.whole_group)
                result = policy(group)
                if result is not group:
                    group.update(result)
                continue
            self._scatter(route, tensordict, policy(self._gather(route, tensordict)))
        return tensordict

    @staticmethod
    def _gather(route: Route, tensordict: TensorDictBase) -> TensorDictBase:
        parts = [tensordict.get(group)[..., index] for group, index in route.segments]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=parts[0].batch_dims - 1)

    @staticmethod
    def _scatter(route: Route, tensordict: TensorDictBase, result: TensorDictBase) -> None:
        offset = 0
        for group_key, index in route.segments:
            group = tensordict.get(group_key)
            agent_dim = group.batch_dims - 1
            piece = result[..., offset : offset + len(index)]
            for key, value in piece.items(include_nested=True, leaves_only=True):
                target = group.get(key, None)
                if target is None:
                    shape = (*group.batch_size, *value.shape[group.batch_dims :])
                    target = torch.zeros(shape, dtype=value.dtype, device=value.device)
                    group.set(key, target)
                target.index_copy_(agent_dim, index.to(target.device), value)
            offset += len(index)

    # --- the batch: one sub-batch per policy id -------------------------------------------------

    def policy(self, policy_id: str) -> nn.Module:
        """The module given for `policy_id` (its weights are the map's `"policies.<id>."` ones).

        Raises:
            KeyError: naming the policy ids, when `policy_id` is none of them.
        """
        if policy_id not in self.policies:
            raise KeyError(
                f"policy_id={policy_id!r} is not one of the policies {sorted(self._given)} "
                "(or names one without weights)."
            )
        return self.policies[policy_id]

    @property
    def regroups(self) -> bool:
        """Whether batches must be regrouped (the policies are not exactly the env's groups)."""
        return any(route.whole_group != pid for pid, route in self.routes.items())

    def policy_batches(self, batch: TensorDictBase) -> TensorDictBase:
        """`batch` with its groups replaced by one sub-batch per policy id, under `policy_id`
        and `("next", policy_id)` (the policy's agents along the agent dim)."""
        groups = [*self._groups, *((keys.NEXT, group) for group in self._groups)]
        out = batch.exclude(*groups)
        for pid, route in self.routes.items():
            for prefix in ((), (keys.NEXT,)):
                out.set((*prefix, pid), self._sub_batch(route, batch, prefix))
        return out

    @staticmethod
    def _sub_batch(route: Route, batch: TensorDictBase, prefix: tuple[str, ...]) -> TensorDictBase:
        if route.whole_group is not None:
            return batch.get((*prefix, route.whole_group))
        parts = [batch.get((*prefix, group))[..., index] for group, index in route.segments]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=parts[0].batch_dims - 1)


def _route(agents: list[tuple[str, int]], group_map: Mapping[str, Sequence[str]]) -> Route:
    segments: list[tuple[str, list[int]]] = []
    for group, index in agents:
        if segments and segments[-1][0] == group:
            segments[-1][1].append(index)
        else:
            segments.append((group, [index]))
    whole = None
    if len(segments) == 1:
        group, indices = segments[0]
        if indices == list(range(len(group_map[group]))):
            whole = group
    return Route(
        tuple((group, torch.tensor(indices)) for group, indices in segments), whole_group=whole
    )


def _entry_layout(env: Any, group: str) -> dict[NestedKey, tuple[int, ...]]:
    """A group's observation and action entries (relative keys) with their per-agent shapes."""
    layout: dict[NestedKey, tuple[int, ...]] = {}
    specs = [(env.observation_spec, env.observation_keys), (env.full_action_spec, env.action_keys)]
    for spec, spec_keys in specs:
        for key in spec_keys:
            if isinstance(key, tuple) and len(key) > 1 and key[0] == group:
                relative = key[1] if len(key) == 2 else key[1:]
                layout[relative] = tuple(spec[key].shape[len(env.batch_size) + 1 :])
    return layout


def policy_or_map(
    policy: Any, policies: Mapping[str, Any] | None, policy_mapping_fn: Callable[[str], str] | None
) -> Any:
    """What the collector runs: `policy`, or a `PolicyMap` of `policies` (RLlib's options).

    Raises:
        TypeError: both `policy` and `policies` given, or a mapping function without policies.
    """
    if policies is None:
        if policy_mapping_fn is not None:
            raise TypeError(
                "policy_mapping_fn maps agents to the policies of policies={...}; pass "
                "policies too, or drop policy_mapping_fn."
            )
        return policy
    if policy is not None:
        raise TypeError(
            "pass policy (one policy for every agent) or policies={id: policy} with "
            "policy_mapping_fn, not both."
        )
    return policies if isinstance(policies, PolicyMap) else PolicyMap(policies, policy_mapping_fn)


def bind_policy_map(policy: Any, env: Any) -> list[Callable[[TensorDictBase], TensorDictBase]]:
    """Bind `policy` to `env` when it is a `PolicyMap`; the batch steps it needs (regrouping
    the groups into one sub-batch per policy id, unless they already are)."""
    if not isinstance(policy, PolicyMap):
        return []
    policy.bind(env)
    return [policy.policy_batches] if policy.regroups else []

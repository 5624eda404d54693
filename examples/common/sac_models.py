"""SAC's networks: a tanh-squashed Gaussian actor and twin Q-networks over (observation, action)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from .env_info import EnvInfo
from .models import activation_class, is_greedy, layer, make_encoder

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0  # keeps the Gaussian from collapsing or exploding


def action_bounds(info: EnvInfo) -> tuple[torch.Tensor, torch.Tensor]:
    """The low and high bounds of a continuous, bounded action space.

    Raises:
        ValueError: when the actions are discrete or unbounded: SAC squashes into the bounds.
    """
    if info.is_discrete or info.action_low is None or info.action_high is None:
        kind = "discrete" if info.is_discrete else "unbounded"
        raise ValueError(
            f"SAC squashes its actions into the env's bounds; this env's actions are {kind}. "
            "Use an env with a bounded Box action space, e.g. env=pendulum."
        )
    return info.action_low.float().reshape(-1), info.action_high.float().reshape(-1)


class SquashedGaussianActor(nn.Module):
    """SAC's policy: a Gaussian squashed by tanh into the action bounds.

    `forward(observation)` returns an action in the env's bounds, sampled (the squashed mean
    when acting greedily), for the collector; `sample(observation)` returns a reparameterised
    sample and its log-probability, for the losses. The log-probability is that of the action
    rescaled to [-1, 1] (as SB3's), so the entropy target `-action_dim` does not depend on the
    bounds.

    Examples:
        >>> from rlcollect.envs import GymEnv
        >>> actor = SquashedGaussianActor(EnvInfo.from_env(GymEnv("Pendulum-v1")))
        >>> action, log_prob = actor.sample(torch.zeros(8, 3))
        >>> action.shape, log_prob.shape, bool(action.abs().max() <= 2.0)
        (torch.Size([8, 1]), torch.Size([8]), True)
    """

    def __init__(
        self,
        info: EnvInfo,
        hidden_sizes: Sequence[int] = (256, 256),
        activation: str = "relu",
    ) -> None:
        super().__init__()
        low, high = action_bounds(info)
        self.encoder, features = make_encoder(info, hidden_sizes, activation)
        self.action_shape = info.action_shape
        self.head = layer(features, 2 * low.numel(), gain=0.01)
        self.register_buffer("action_center", (high + low) / 2)
        self.register_buffer("action_scale", (high - low) / 2)

    def _distribution(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.head(self.encoder(observation)).chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def _to_bounds(self, squashed: torch.Tensor) -> torch.Tensor:
        action = self.action_center + self.action_scale * squashed
        return action.reshape(*squashed.shape[:-1], *self.action_shape)

    def sample(
        self, observation: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised action (in the bounds) and its log-probability, shape `[...]`;
        the noise is drawn from `generator` (default: torch's global one)."""
        mean, log_std = self._distribution(observation)
        noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype, device=mean.device)
        unsquashed = mean + log_std.exp() * noise
        gaussian = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
        # log(1 - tanh(u)^2), written to stay finite for large |u|
        squash = 2.0 * (math.log(2.0) - unsquashed - nn.functional.softplus(-2.0 * unsquashed))
        return self._to_bounds(unsquashed.tanh()), (gaussian - squash).sum(-1)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        if is_greedy():
            mean, _ = self._distribution(observation)
            return self._to_bounds(mean.tanh())
        return self.sample(observation)[0]


class EnsembleLinear(nn.Module):
    """`members` independent linear layers applied as one batched matmul: `[members, N, in]`
    to `[members, N, out]` (on small networks the per-op overhead dominates, so one op for
    both Q-networks costs about half of two)."""

    def __init__(self, members: int, in_features: int, out_features: int, gain: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(members, in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(members, 1, out_features))
        for member in self.weight:  # each as `layer` initialises one: orthogonal, zero bias
            nn.init.orthogonal_(member, gain)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, inputs, self.weight)


class TwinQCritic(nn.Module):
    """Two independent Q-networks over `[observation, action]`: `forward` returns both, each of
    shape `[..., 1]`; SAC's targets take their minimum against over-estimation. The two run as
    one ensemble (`EnsembleLinear`).

    Examples:
        >>> from rlcollect.envs import GymEnv
        >>> critic = TwinQCritic(EnvInfo.from_env(GymEnv("Pendulum-v1")))
        >>> q1, q2 = critic(torch.zeros(8, 3), torch.zeros(8, 1))
        >>> q1.shape, q2.shape
        (torch.Size([8, 1]), torch.Size([8, 1]))
    """

    def __init__(
        self,
        info: EnvInfo,
        hidden_sizes: Sequence[int] = (256, 256),
        activation: str = "relu",
    ) -> None:
        super().__init__()
        if len(info.observation_shape) != 1:
            raise ValueError(
                f"TwinQCritic reads flat observations; got shape {info.observation_shape}."
            )
        act = activation_class(activation)
        width = info.observation_shape[0] + math.prod(action_bounds(info)[0].shape)
        layers: list[nn.Module] = []
        for size in hidden_sizes:
            layers += [EnsembleLinear(2, width, int(size), gain=math.sqrt(2)), act()]
            width = int(size)
        layers.append(EnsembleLinear(2, width, 1, gain=1.0))
        self.q_networks = nn.Sequential(*layers)

    def forward(
        self, observation: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        flat_action = action.reshape(*observation.shape[:-1], -1)
        inputs = torch.cat([observation, flat_action.to(observation.dtype)], dim=-1)
        leading = inputs.shape[:-1]
        both = self.q_networks(inputs.reshape(1, -1, inputs.shape[-1]).expand(2, -1, -1))
        q1, q2 = both.reshape(2, *leading, 1).unbind(0)
        return q1, q2

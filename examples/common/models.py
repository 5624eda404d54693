"""The example networks: an encoder (MLP, small CNN or CleanRL's Nature CNN), a stochastic actor,
a critic, a Q-net."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from tensordict.nn import InteractionType
from tensordict.nn.probabilistic import interaction_type
from torch import nn

from .env_info import EnvInfo

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}
GREEDY_TYPES = (InteractionType.DETERMINISTIC, InteractionType.MODE, InteractionType.MEAN)


def is_greedy() -> bool:
    """Whether the policy should act greedily (under `set_interaction_type(DETERMINISTIC)`)."""
    return interaction_type() in GREEDY_TYPES


def layer(in_features: int, out_features: int, gain: float = math.sqrt(2)) -> nn.Linear:
    """A linear layer with orthogonal weights and zero bias (as CleanRL initialises PPO nets)."""
    linear = nn.Linear(in_features, out_features)
    nn.init.orthogonal_(linear.weight, gain)
    nn.init.zeros_(linear.bias)
    return linear


def activation_class(name: str) -> type[nn.Module]:
    """The activation module class called `name` (tanh, relu or elu)."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation={name!r}: expected one of {sorted(ACTIVATIONS)}.")
    return ACTIVATIONS[name]


class PixelEncoder(nn.Module):
    """Two convolutions and a linear layer over `[..., H, W, C]` images (uint8 or float)."""

    def __init__(self, observation_shape: Sequence[int], features: int, activation: str) -> None:
        super().__init__()
        height, width, channels = observation_shape
        act = activation_class(activation)
        self.image_dims = 3
        self.convolutions = nn.Sequential(
            nn.Conv2d(channels, 16, kernel_size=3, padding=1),
            act(),
            nn.Conv2d(16, 32, kernel_size=3, stride=2, padding=1),
            act(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = self.convolutions(torch.zeros(1, channels, height, width)).shape[-1]
        self.head = nn.Sequential(layer(flat, features), act())

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        leading = pixels.shape[: -self.image_dims]
        images = pixels.reshape(-1, *pixels.shape[-self.image_dims :]).permute(0, 3, 1, 2)
        if not images.is_floating_point():
            images = images.float() / 255.0
        return self.head(self.convolutions(images)).reshape(*leading, -1)


class NatureCNN(nn.Module):
    """CleanRL's Atari encoder (the DQN Nature paper's): three convolutions (32 8x8 stride 4,
    64 4x4 stride 2, 64 3x3 stride 1) and a 512-unit linear layer, ReLU after each, over
    channel-first frame stacks `[..., C, H, W]` (EnvPool's `[4, 84, 84]` uint8, scaled to
    [0, 1])."""

    features = 512

    def __init__(self, observation_shape: Sequence[int]) -> None:
        super().__init__()
        channels, height, width = observation_shape
        self.image_dims = 3
        self.convolutions = nn.Sequential(
            convolution(channels, 32, 8, 4),
            nn.ReLU(),
            convolution(32, 64, 4, 2),
            nn.ReLU(),
            convolution(64, 64, 3, 1),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = self.convolutions(torch.zeros(1, channels, height, width)).shape[-1]
        self.head = nn.Sequential(layer(flat, self.features), nn.ReLU())

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        leading = frames.shape[: -self.image_dims]
        images = frames.reshape(-1, *frames.shape[-self.image_dims :])
        if not images.is_floating_point():
            images = images.float() / 255.0
        return self.head(self.convolutions(images)).reshape(*leading, -1)


def convolution(in_channels: int, out_channels: int, kernel: int, stride: int) -> nn.Conv2d:
    """A convolution with orthogonal weights and zero bias, as CleanRL initialises its CNN."""
    conv = nn.Conv2d(in_channels, out_channels, kernel_size=kernel, stride=stride)
    nn.init.orthogonal_(conv.weight, math.sqrt(2))
    nn.init.zeros_(conv.bias)
    return conv


def is_frame_stack(shape: Sequence[int]) -> bool:
    """Whether `shape` is a channel-first stack of frames, `[C, H, W]` with a few channels (as
    EnvPool's Atari tasks give, `[4, 84, 84]`), rather than an `[H, W, C]` image."""
    return len(shape) == 3 and shape[0] <= 4 < min(shape[1], shape[2])


def make_encoder(
    info: EnvInfo, hidden_sizes: Sequence[int], activation: str
) -> tuple[nn.Module, int]:
    """An encoder for the env's observations and its number of output features.

    Flat observations get an MLP with `hidden_sizes`; channel-first frame stacks (Atari through
    EnvPool, `[4, 84, 84]`) get CleanRL's `NatureCNN` (512 features); other `[H, W, C]` images
    get `PixelEncoder` with `hidden_sizes[-1]` features.
    """
    sizes = [int(size) for size in hidden_sizes]
    if not sizes:
        raise ValueError("hidden_sizes must name at least one layer size, e.g. [64, 64].")
    act = activation_class(activation)
    if is_frame_stack(info.observation_shape):
        return NatureCNN(info.observation_shape), NatureCNN.features
    if len(info.observation_shape) == 3:
        return PixelEncoder(info.observation_shape, sizes[-1], activation), sizes[-1]
    if len(info.observation_shape) != 1:
        raise ValueError(
            f"observations of shape {info.observation_shape} are not handled: expected a flat "
            "vector or an [H, W, C] image."
        )
    layers: list[nn.Module] = []
    width = info.observation_shape[0]
    for size in sizes:
        layers += [layer(width, size), act()]
        width = size
    return nn.Sequential(*layers), width


class Actor(nn.Module):
    """A stochastic policy: categorical over discrete actions, Gaussian over continuous ones.

    `forward(observation)` returns `(action, log_prob)`: a sample (the mode when acting
    greedily) and its log-probability, so a `TensorDictModule` with out keys
    `["action", "sample_log_prob"]` runs it on the collector's fast path.

    Examples:
        >>> from rlcollect.envs import GymEnv
        >>> info = EnvInfo.from_env(GymEnv("CartPole-v1", categorical_action_encoding=True))
        >>> action, log_prob = Actor(info)(torch.zeros(8, 4))
        >>> action.shape, action.dtype, log_prob.shape
        (torch.Size([8]), torch.int64, torch.Size([8]))
    """

    def __init__(
        self,
        info: EnvInfo,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        init_log_std: float = 0.0,
    ) -> None:
        super().__init__()
        self.encoder, features = make_encoder(info, hidden_sizes, activation)
        self.is_discrete = info.is_discrete
        outputs = info.num_actions if info.num_actions is not None else math.prod(info.action_shape)
        self.head = layer(features, outputs, gain=0.01)
        self.action_shape = info.action_shape
        if not self.is_discrete:
            self.log_std = nn.Parameter(torch.full((outputs,), float(init_log_std)))

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.head(self.encoder(observation))
        if self.is_discrete:
            log_probs = out.log_softmax(-1)
            if is_greedy():
                action = log_probs.argmax(-1)
            else:  # Gumbel-max: argmax(logits + Gumbel noise) samples the categorical
                action = (log_probs - torch.empty_like(log_probs).exponential_().log()).argmax(-1)
            return action, log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        std = self.log_std.exp()
        action = out if is_greedy() else out + std * torch.randn_like(out)
        return action.reshape(*out.shape[:-1], *self.action_shape), self._normal_log_prob(
            out, action
        )

    def _normal_log_prob(self, mean: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        z = (action - mean) / self.log_std.exp()
        per_dim = -0.5 * z.pow(2) - self.log_std - 0.5 * math.log(2 * math.pi)
        return per_dim.sum(-1)

    def evaluate(
        self, observation: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The log-probability of `action` and the policy's entropy at `observation`."""
        out = self.head(self.encoder(observation))
        if self.is_discrete:
            log_probs = out.log_softmax(-1)
            # an index per row: [...] as the env takes it, or [..., 1] as a RolloutBuffer stores it
            index = action.long().reshape(*log_probs.shape[:-1], 1)
            log_prob = log_probs.gather(-1, index).squeeze(-1)
            entropy = -(log_probs.exp() * log_probs).sum(-1)
            return log_prob, entropy
        flat_action = action.reshape(*out.shape)
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + self.log_std).sum().expand(out.shape[:-1])
        return self._normal_log_prob(out, flat_action), entropy


class Critic(nn.Module):
    """A state-value network: `forward(observation)` returns `V(observation)`, shape `[..., 1]`."""

    def __init__(
        self, info: EnvInfo, hidden_sizes: Sequence[int] = (64, 64), activation: str = "tanh"
    ) -> None:
        super().__init__()
        self.encoder, features = make_encoder(info, hidden_sizes, activation)
        self.head = layer(features, 1, gain=1.0)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(observation))


class QNetwork(nn.Module):
    """Action values for a discrete action space: `forward(observation)` is `[..., n]`."""

    def __init__(
        self, info: EnvInfo, hidden_sizes: Sequence[int] = (120, 84), activation: str = "relu"
    ) -> None:
        super().__init__()
        if info.num_actions is None:
            raise ValueError(
                "QNetwork needs a discrete action space; the env's actions are continuous."
            )
        self.encoder, features = make_encoder(info, hidden_sizes, activation)
        self.head = nn.Linear(features, info.num_actions)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(observation))


class EpsilonGreedy(nn.Module):
    """Acts greedily on a Q-network, or uniformly at random with probability `epsilon`.

    `epsilon` is a buffer, so it travels with the weights (`state_dict`, and the collector's
    `update_policy_weights_`); greedy interaction types ignore it.

    Examples:
        >>> from rlcollect.envs import GymEnv
        >>> info = EnvInfo.from_env(GymEnv("CartPole-v1", categorical_action_encoding=True))
        >>> policy = EpsilonGreedy(QNetwork(info), epsilon=1.0)
        >>> policy(torch.zeros(5, 4)).shape
        torch.Size([5])
    """

    def __init__(self, q_network: QNetwork, epsilon: float = 1.0) -> None:
        super().__init__()
        self.q_network = q_network
        self.num_actions = q_network.head.out_features
        self.register_buffer("epsilon", torch.tensor(float(epsilon)))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        action = self.q_network(observation).argmax(-1)
        if is_greedy():
            return action
        explore = torch.rand(action.shape) < self.epsilon
        random_action = torch.randint_like(action, self.num_actions)
        return torch.where(explore, random_action, action)

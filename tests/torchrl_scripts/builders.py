"""Builders for the sota-script tests: TorchRL's envs, networks, losses and buffers, shaped as
TorchRL's `sota-implementations` shape them (pytorch/rl, written here from reading them), tiny.

Each `*_collector_arguments` gives the keyword arguments that script's default config hands
TorchRL's collector, value for value (`sota-implementations/<algo>/config*.yaml` and the
`Collector(...)` call of its script or `utils.py`), with two changes to fit a test's time:
`frames_per_batch` is the config's divided by `SHRINK` (`tiny(2048)` is PPO's 2,048), and
`init_random_frames` is one batch (the configs' 1,000 to 25,000 random frames would be the whole
test). Networks are two layers of 16; `env_per_collector` 8 is 2, in a `SerialEnv`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType, NormalParamExtractor, TensorDictModule
from tensordict.nn import TensorDictSequential as Seq
from torch import nn
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs import (
    ClipTransform,
    Compose,
    DoubleToFloat,
    EnvBase,
    InitTracker,
    RewardSum,
    SerialEnv,
    StepCounter,
    TransformedEnv,
    VecNorm,
)
from torchrl.envs.libs.gym import GymEnv
from torchrl.modules import (
    MLP,
    AdditiveGaussianModule,
    EGreedyModule,
    OneHotCategorical,
    OrnsteinUhlenbeckProcessModule,
    ProbabilisticActor,
    QValueActor,
    TanhModule,
    TanhNormal,
    ValueOperator,
)
from torchrl.objectives import (
    A2CLoss,
    ClipPPOLoss,
    DDPGLoss,
    DiscreteSACLoss,
    DQNLoss,
    IQLLoss,
    SACLoss,
    SoftUpdate,
    TD3Loss,
)
from torchrl.objectives.value import GAE

HIDDEN = (16, 16)
SHRINK = 8


def tiny(frames_per_batch: int) -> int:
    """A config's `frames_per_batch`, shrunk for a test."""
    return frames_per_batch // SHRINK


# --- envs (each script's make_env / make_environment) -------------------------------------------


def gym(name: str) -> EnvBase:
    return GymEnv(name, device="cpu", from_pixels=False, pixels_only=False)


def dqn_cartpole_env() -> EnvBase:
    """dqn/utils_cartpole.py: CartPole with RewardSum and StepCounter."""
    env = TransformedEnv(gym("CartPole-v1"))
    env.append_transform(RewardSum())
    env.append_transform(StepCounter())
    return env


def ppo_mujoco_env() -> EnvBase:
    """ppo/utils_mujoco.py (backend gym, normalize_observation True)."""
    env = TransformedEnv(gym("HalfCheetah-v4"))
    env.append_transform(VecNorm(in_keys=["observation"], decay=0.99999, eps=1e-2))
    env.append_transform(ClipTransform(in_keys=["observation"], low=-10, high=10))
    env.append_transform(RewardSum())
    env.append_transform(StepCounter(max_steps=None))
    env.append_transform(DoubleToFloat(in_keys=["observation"]))
    return env


def a2c_mujoco_env() -> EnvBase:
    """a2c/utils_mujoco.py."""
    env = TransformedEnv(gym("HalfCheetah-v4"))
    env.append_transform(RewardSum())
    env.append_transform(StepCounter())
    env.append_transform(VecNorm(in_keys=["observation"]))
    env.append_transform(ClipTransform(in_keys=["observation"], low=-10, high=10))
    env.append_transform(DoubleToFloat(in_keys=["observation"]))
    return env


def off_policy_env(name: str, num_envs: int, max_episode_steps: int | None, seed: int) -> EnvBase:
    """sac/td3/ddpg/iql/discrete_sac utils.py: a batch of `env_per_collector` envs (a
    ParallelEnv there; serial here, to start no process) with InitTracker, StepCounter
    (none for IQL: `max_episode_steps=None`), DoubleToFloat and RewardSum."""
    batched = SerialEnv(num_envs, lambda: gym(name))
    batched.set_seed(seed)
    counter = [] if max_episode_steps is None else [StepCounter(max_episode_steps)]
    return TransformedEnv(batched, Compose(InitTracker(), *counter, DoubleToFloat(), RewardSum()))


def one_env_spec(env: EnvBase) -> Any:
    spec = env.action_spec
    return spec[(0,) * len(env.batch_size)] if env.batch_size else spec


# --- networks ------------------------------------------------------------------------------------


def mlp(out_features: int) -> MLP:
    return MLP(num_cells=HIDDEN, out_features=out_features, activation_class=nn.Tanh)


def tanh_normal_actor(env: EnvBase, return_log_prob: bool = False) -> ProbabilisticActor:
    spec = one_env_spec(env)
    net = nn.Sequential(mlp(2 * spec.shape[-1]), NormalParamExtractor())
    module = TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"])
    return ProbabilisticActor(
        module,
        in_keys=["loc", "scale"],
        spec=env.full_action_spec_unbatched,
        distribution_class=TanhNormal,
        distribution_kwargs={"low": spec.space.low, "high": spec.space.high},
        default_interaction_type=InteractionType.RANDOM,
        return_log_prob=return_log_prob,
    )


def state_value() -> ValueOperator:
    return ValueOperator(mlp(1), in_keys=["observation"])


def action_value() -> ValueOperator:
    return ValueOperator(mlp(1), in_keys=["observation", "action"])


def deterministic_actor(env: EnvBase) -> Seq:
    spec = one_env_spec(env)
    net = TensorDictModule(mlp(spec.shape[-1]), in_keys=["observation"], out_keys=["param"])
    return Seq(net, TanhModule(in_keys=["param"], out_keys=["action"], spec=spec))


def initialise(env: EnvBase, *modules: nn.Module) -> None:
    """Run each module once on a reset, as the scripts do (lazy layers, specs)."""
    with torch.no_grad():
        td = env.fake_tensordict()[..., 0] if env.batch_size else env.fake_tensordict()
        for module in modules:
            module(td.clone())


# --- buffers -------------------------------------------------------------------------------------


def replay_buffer(size: int, batch_size: int) -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(storage=LazyTensorStorage(size), batch_size=batch_size)


# --- one script each -----------------------------------------------------------------------------


def setup_dqn() -> dict[str, Any]:
    """dqn/dqn_cartpole.py with config_cartpole.yaml."""
    env = dqn_cartpole_env()
    spec = env.action_spec
    model = QValueActor(mlp(spec.shape[-1]), in_keys=["observation"], spec=spec)
    initialise(env, model)
    explore = Seq(
        model, EGreedyModule(spec=spec, annealing_num_steps=250_000, eps_init=1.0, eps_end=0.05)
    )
    loss = DQNLoss(value_network=model, loss_function="l2", delay_value=True)
    loss.make_value_estimator(gamma=0.99)
    frames_per_batch = tiny(1000)
    return {
        "collector": {
            "create_env_fn": env,
            "policy": explore,
            "frames_per_batch": frames_per_batch,
            "total_frames": 500_100,
            "device": "cpu",
            "storing_device": "cpu",
            "max_frames_per_traj": -1,
            "init_random_frames": frames_per_batch,
            "compile_policy": False,
            "cudagraph_policy": False,
        },
        "policy": model,
        "loss": loss,
        "updater": SoftUpdate(loss, eps=0.995),
        "buffer": replay_buffer(10_000, 32),
        "on_policy": False,
        "after_batch": lambda batch: explore[1].step(batch.numel()),
    }


def on_policy(env: EnvBase, loss_class: Callable[..., nn.Module], **loss_options: Any) -> dict:
    actor = tanh_normal_actor(env, return_log_prob=True)
    critic = state_value()
    initialise(env, actor, critic)
    loss = loss_class(actor_network=actor, critic_network=critic, **loss_options)
    advantage = GAE(gamma=0.99, lmbda=0.95, value_network=critic, average_gae=False)
    return {"policy": actor, "loss": loss, "advantage": advantage, "on_policy": True}


def setup_ppo() -> dict[str, Any]:
    """ppo/ppo_mujoco.py with config_mujoco.yaml (device cpu: no accelerator here)."""
    env = ppo_mujoco_env()
    parts = on_policy(env, ClipPPOLoss, clip_epsilon=0.2, entropy_coeff=0.0)
    parts["collector"] = {
        "create_env_fn": env,
        "policy": parts["policy"],
        "frames_per_batch": tiny(2048),
        "total_frames": 1_000_000,
        "device": torch.device("cpu"),
        "max_frames_per_traj": -1,
        "compile_policy": False,
        "cudagraph_policy": False,
    }
    parts["buffer"] = replay_buffer(tiny(2048), 64)
    return parts


def setup_a2c() -> dict[str, Any]:
    """a2c/a2c_mujoco.py with config_mujoco.yaml (device cpu)."""
    env = a2c_mujoco_env()
    parts = on_policy(env, A2CLoss, entropy_coeff=0.0, critic_coeff=0.25)
    parts["collector"] = {
        "create_env_fn": env,
        "policy": parts["policy"],
        "frames_per_batch": tiny(640),
        "total_frames": 1_000_000,
        "device": torch.device("cpu"),
        "storing_device": torch.device("cpu"),
        "max_frames_per_traj": -1,
        "trust_policy": True,
        "compile_policy": False,
        "cudagraph_policy": False,
    }
    parts["buffer"] = replay_buffer(tiny(640), 64)
    return parts


def off_policy(
    env: EnvBase, policy: nn.Module, loss: nn.Module, collector: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    frames = collector["frames_per_batch"]
    collector = {"create_env_fn": env, "policy": policy, **collector, "init_random_frames": frames}
    return {
        "collector": collector,
        "policy": policy,
        "loss": loss,
        "updater": SoftUpdate(loss, eps=0.995),
        "buffer": replay_buffer(4 * frames, 64),
        "on_policy": False,
        "seed": extra.pop("seed"),
        **extra,
    }


def setup_sac() -> dict[str, Any]:
    """sac/sac.py with config.yaml (env_per_collector 8 -> 2 here, device None -> cpu)."""
    env = off_policy_env("HalfCheetah-v4", 2, max_episode_steps=1000, seed=42)
    actor = tanh_normal_actor(env)
    qvalue = action_value()
    initialise(env, actor, qvalue)
    loss = SACLoss(actor, qvalue, num_qvalue_nets=2, loss_function="l2", delay_qvalue=True)
    loss.make_value_estimator(gamma=0.99)
    arguments = {
        "frames_per_batch": tiny(1000),
        "total_frames": 1_000_000,
        "device": torch.device("cpu"),
        "compile_policy": False,
        "cudagraph_policy": False,
    }
    return off_policy(env, actor, loss, arguments, seed=42)


def setup_td3() -> dict[str, Any]:
    """td3/td3.py with config.yaml (env_per_collector 8 -> 2 here, device None -> cpu)."""
    env = off_policy_env("HalfCheetah-v4", 2, max_episode_steps=1000, seed=42)
    actor = deterministic_actor(env)
    qvalue = action_value()
    initialise(env, actor, qvalue)
    explore = Seq(
        actor,
        AdditiveGaussianModule(spec=one_env_spec(env), sigma_init=1, sigma_end=1, mean=0, std=0.1),
    )
    loss = TD3Loss(
        actor_network=actor,
        qvalue_network=qvalue,
        num_qvalue_nets=2,
        loss_function="l2",
        delay_actor=True,
        delay_qvalue=True,
        action_spec=one_env_spec(env),
    )
    loss.make_value_estimator(gamma=0.99)
    arguments = {
        "frames_per_batch": tiny(1000),
        "total_frames": 1000000,
        "reset_at_each_iter": False,
        "device": torch.device("cpu"),
        "compile_policy": False,
        "cudagraph_policy": False,
    }
    parts = off_policy(env, explore, loss, arguments, seed=42)
    parts["policy"] = actor
    return parts


def setup_ddpg() -> dict[str, Any]:
    """ddpg/ddpg.py with config.yaml (env_per_collector 1, Ornstein-Uhlenbeck noise)."""
    env = off_policy_env("HalfCheetah-v4", 1, max_episode_steps=1000, seed=42)
    actor = deterministic_actor(env)
    qvalue = action_value()
    initialise(env, actor, qvalue)
    explore = Seq(
        actor,
        OrnsteinUhlenbeckProcessModule(
            spec=one_env_spec(env), annealing_num_steps=1_000_000, safe=False
        ),
    )
    loss = DDPGLoss(actor_network=actor, value_network=qvalue, loss_function="l2", delay_actor=True)
    loss.make_value_estimator(gamma=0.99)
    arguments = {
        "frames_per_batch": tiny(1000),
        "reset_at_each_iter": False,
        "total_frames": 1_000_000,
        "device": torch.device("cpu"),
        "compile_policy": False,
        "cudagraph_policy": False,
    }
    parts = off_policy(env, explore, loss, arguments, seed=42)
    parts["policy"] = actor
    return parts


def setup_iql() -> dict[str, Any]:
    """iql/iql_online.py with online_config.yaml (Pendulum, one env)."""
    env = off_policy_env("Pendulum-v1", 1, max_episode_steps=None, seed=0)
    actor = tanh_normal_actor(env)
    qvalue = action_value()
    value = state_value()
    initialise(env, actor, qvalue, value)
    loss = IQLLoss(
        actor_network=actor,
        qvalue_network=qvalue,
        value_network=value,
        num_qvalue_nets=2,
        loss_function="l2",
        temperature=3.0,
        expectile=0.7,
    )
    loss.make_value_estimator(gamma=0.99)
    arguments = {
        "frames_per_batch": tiny(200),
        "max_frames_per_traj": 200,
        "total_frames": 20000,
        "device": torch.device("cpu"),
        "compile_policy": False,
        "cudagraph_policy": False,
    }
    return off_policy(env, actor, loss, arguments, seed=0)


def setup_discrete_sac() -> dict[str, Any]:
    """discrete_sac/discrete_sac.py with config.yaml (CartPole, one env)."""
    env = off_policy_env("CartPole-v1", 1, max_episode_steps=500, seed=42)
    spec = one_env_spec(env)
    logits = TensorDictModule(mlp(spec.shape[-1]), in_keys=["observation"], out_keys=["logits"])
    actor = ProbabilisticActor(
        logits,
        in_keys=["logits"],
        out_keys=["action"],
        spec=env.full_action_spec_unbatched,
        distribution_class=OneHotCategorical,
        default_interaction_type=InteractionType.RANDOM,
        return_log_prob=False,
    )
    qvalue = TensorDictModule(
        mlp(spec.shape[-1]), in_keys=["observation"], out_keys=["action_value"]
    )
    initialise(env, actor, qvalue)
    loss = DiscreteSACLoss(
        actor_network=actor,
        qvalue_network=qvalue,
        num_actions=spec.space.n,
        num_qvalue_nets=2,
        loss_function="l2",
        action_space=spec,
    )
    loss.make_value_estimator(gamma=0.99)
    arguments = {
        "frames_per_batch": tiny(500),
        "total_frames": 25000,
        "reset_at_each_iter": False,
        "device": torch.device("cpu"),
        "storing_device": "cpu",
        "compile_policy": False,
        "cudagraph_policy": False,
    }
    return off_policy(env, actor, loss, arguments, seed=42)


SCRIPTS: dict[str, Callable[[], dict[str, Any]]] = {
    "dqn_cartpole": setup_dqn,
    "ppo_mujoco": setup_ppo,
    "a2c_mujoco": setup_a2c,
    "sac": setup_sac,
    "td3": setup_td3,
    "ddpg": setup_ddpg,
    "iql_online": setup_iql,
    "discrete_sac": setup_discrete_sac,
}
# The scripts on MuJoCo's HalfCheetah (the `mujoco` extra).
MUJOCO = {"ppo_mujoco", "a2c_mujoco", "sac", "td3", "ddpg"}


def total_loss(losses: TensorDictBase) -> torch.Tensor:
    """The sum of a loss module's `loss*` entries, as every script sums them."""
    return sum(value for key, value in losses.items() if key.startswith("loss"))  # type: ignore[return-value]


def flat(batch: TensorDictBase) -> TensorDictBase:
    return batch.reshape(-1)

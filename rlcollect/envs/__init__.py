"""Envs: the TorchRL-compatible env protocol, specs, Gymnasium and PettingZoo wrappers, and
batched envs."""

from rlcollect.envs.base import EnvBase
from rlcollect.envs.carrier import allocate_carrier
from rlcollect.envs.dict_agents import DictAgentsEnv
from rlcollect.envs.envpool_env import EnvPoolEnv
from rlcollect.envs.gym import GymEnv
from rlcollect.envs.gym_vector import GymVectorEnv
from rlcollect.envs.parallel import ParallelEnv
from rlcollect.envs.pettingzoo_aec import PettingZooAECEnv
from rlcollect.envs.pettingzoo_env import PettingZooEnv
from rlcollect.envs.serial import SerialEnv
from rlcollect.envs.specs import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    OneHot,
    TensorSpec,
    Unbounded,
)

__all__ = [
    "Binary",
    "Bounded",
    "Categorical",
    "Composite",
    "DictAgentsEnv",
    "EnvBase",
    "EnvPoolEnv",
    "GymEnv",
    "GymVectorEnv",
    "OneHot",
    "ParallelEnv",
    "PettingZooAECEnv",
    "PettingZooEnv",
    "SerialEnv",
    "TensorSpec",
    "Unbounded",
    "allocate_carrier",
]

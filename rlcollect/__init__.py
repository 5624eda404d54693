"""rlcollect: fast, composable data collection for reinforcement learning in PyTorch."""

from rlcollect.collectors import Collector
from rlcollect.envs import EnvBase, GymEnv

__all__ = ["Collector", "EnvBase", "GymEnv"]
__version__ = "0.1.0"

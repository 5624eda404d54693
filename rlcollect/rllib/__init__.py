"""RLlib's door: EnvRunners that RLlib's Algorithms build (`env_runner_cls=`), rlcollect's loop
inside, RLlib's episodes, module, connectors and state outside. Needs the `rllib` extra."""

from rlcollect.rllib.env_backends import EnvPoolBackend, GymVectorBackend, ParallelEnvBackend
from rlcollect.rllib.multi_agent import MultiAgentEnvRunner
from rlcollect.rllib.single_agent import SingleAgentEnvRunner

__all__ = [
    "EnvPoolBackend",
    "GymVectorBackend",
    "MultiAgentEnvRunner",
    "ParallelEnvBackend",
    "SingleAgentEnvRunner",
]

"""RLlib's door: EnvRunners that RLlib's Algorithms build (`env_runner_cls=`), the engine's loop
inside, RLlib's episodes, module, connectors and state outside. Needs the `rllib` extra.

In: RLlib's config (env, vectorize mode, counts, module spec, connectors, callbacks, fault
tolerance) and `sample()` / `get_state()` / `set_state()` calls. Out: RLlib's episode chunks,
metrics and state. File by file, for the single-agent runner:

1. `single_agent.py` / `runner_base.py`: RLlib's EnvRunner contract (counts, explore, state,
   callbacks, metrics, checkpoints).
2. `env_backends.py` (with `env_building.py`): the engine env the config asks for
   (`GymVectorEnv` over RLlib's vector env by default, `EnvPoolEnv`, `ParallelEnv`).
3. `engine_loops.py`: the engine's `RolloutLoop` over that env, one per batch length, and
   RLlib's fault tolerance around it; no env is stepped anywhere else in this package's
   single-agent path.
4. `module_forward.py` (the batched step: the RLModule as the loop's policy step, read back by
   `engine_sampler.py`, `batch_episodes.py`, `episode_chunks.py`) or `pipeline_sampler.py`
   (RLlib's connectors and callbacks on live episodes, as the loop's policy step).

The multi-agent runner (`multi_agent*.py`) still steps RLlib's multi-agent env in its own
loop. Nothing of the engine imports this package (an import contract in pyproject.toml).
"""

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

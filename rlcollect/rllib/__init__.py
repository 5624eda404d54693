"""RLlib's door: EnvRunners that RLlib's Algorithms build (`env_runner_cls=`), the engine's loop
inside, RLlib's episodes, module, connectors and state outside. Needs the `rllib` extra.

In: RLlib's config (env, vectorize mode, counts, module spec, connectors, callbacks, fault
tolerance) and `sample()` / `get_state()` / `set_state()` calls. Out: RLlib's episode chunks,
metrics and state. File by file:

1. `single_agent.py` / `multi_agent.py` / `runner_base.py`: RLlib's EnvRunner contract (counts,
   explore, state, callbacks, metrics, checkpoints).
2. `env_backends.py` (with `env_building.py`): the single-agent engine env the config asks for
   (`GymVectorEnv` over RLlib's vector env by default, `EnvPoolEnv`, `ParallelEnv`);
   `multi_agent.py` builds RLlib's vector of `MultiAgentEnv`s and the engine's
   `DictAgentsEnv` over its sub-envs.
3. `engine_loops.py`: the engine's `RolloutLoop` over that env, one per batch length, and
   RLlib's fault tolerance around it; no env is stepped anywhere else in this package.
4. The loop's policy step: `module_forward.py` (the batched step: the RLModule on the
   carrier's tensors, read back by `engine_sampler.py`, `batch_episodes.py`,
   `episode_chunks.py`), or `pipeline_sampler.py` (RLlib's connectors and callbacks on live
   `SingleAgentEpisode`s) and `multi_agent_sampler.py` (the same on live `MultiAgentEpisode`s,
   the agent dicts read from the env's step record).

Nothing of the engine imports this package (an import contract in pyproject.toml).
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

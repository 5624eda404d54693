"""Testing helpers for env authors: the `check_env` conformance check and counting envs."""

from rlcollect.testing.check_env import check_env
from rlcollect.testing.counting import CountingEnv, TensorDictCountingEnv

__all__ = ["CountingEnv", "TensorDictCountingEnv", "check_env"]

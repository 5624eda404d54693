"""Run a TorchRL project on rlcollect without editing it: TorchRL's collector names bound to
ours in every interpreter of a run, as `patch_sklearn()` / `python -m sklearnex` do for
scikit-learn.

- `rlcollect.patch_torchrl()` / `rlcollect.unpatch_torchrl()` in a script;
- `python -m rlcollect.patch script.py args...` or `python -m rlcollect.patch -m module args...`;
- `RLCOLLECT_PATCH_TORCHRL=1` for runs started by other tools (with the launcher's
  `PYTHONPATH`, or the `.pth` line `python -m rlcollect.patch --install-hook` writes);
- `RLCOLLECT_PATCH_VERBOSE=1`: a line for each collector built, with its process id;
- `environment_variables()`: what a process needs to patch itself at start (e.g. for the
  `runtime_env` of a Ray cluster already running).

Nothing here imports TorchRL until the patch is applied.
"""

from rlcollect.patch.apply import (
    UntestedTorchRLVersionWarning,
    is_patched,
    patch_torchrl,
    unpatch_torchrl,
)
from rlcollect.patch.child_environment import child_variables as environment_variables
from rlcollect.patch.targets import TESTED_TORCHRL_VERSIONS

__all__ = [
    "TESTED_TORCHRL_VERSIONS",
    "UntestedTorchRLVersionWarning",
    "environment_variables",
    "is_patched",
    "patch_torchrl",
    "unpatch_torchrl",
]

"""A driver that starts a Ray cluster of its own and asks an actor what
`torchrl.collectors.Collector` is there. The driver never imports TorchRL's collectors: the
actor's interpreter patches itself, from the variables it inherits.

    python -m rlcollect.patch ray_actor.py   # the cluster inherits the driver's variables
    python ray_actor.py --runtime-env        # unpatched; the job's runtime_env carries them
"""

from __future__ import annotations

import json
import os
import sys

import ray


@ray.remote
class Probe:
    def resolve(self) -> dict:
        import torchrl.collectors

        return {
            "Collector": torchrl.collectors.Collector.__module__,
            "pid": os.getpid(),
        }


def main() -> None:
    runtime_env = None
    if "--runtime-env" in sys.argv:
        from rlcollect.patch import environment_variables

        runtime_env = {"env_vars": environment_variables()}
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, runtime_env=runtime_env)
    try:
        probe = Probe.remote()
        found = ray.get(probe.resolve.remote(), timeout=240)
    finally:
        ray.shutdown()
    found["driver_pid"] = os.getpid()
    found["driver_imported_torchrl_collectors"] = "torchrl.collectors" in sys.modules
    print(json.dumps(found))  # noqa: T201


if __name__ == "__main__":
    main()

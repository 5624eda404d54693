"""`python -m benchmarl.run` on TorchRL's own `Collector`: the reference for test_benchmarl.py.

BenchMARL 1.5.2 imports `SyncDataCollector`, a name TorchRL 0.14.1 removed (it became
`Collector`). This points the removed name at TorchRL's `Collector` and runs `benchmarl.run`
with the Hydra overrides given:

    python tests/torchrl_frontends/benchmarl_on_torchrl.py algorithm=mappo task=vmas/balance ...
"""

from __future__ import annotations

import runpy
import sys


def main(overrides: list[str]) -> None:
    import torchrl.collectors

    torchrl.collectors.SyncDataCollector = torchrl.collectors.Collector  # type: ignore[attr-defined]
    sys.argv = ["benchmarl.run", *overrides]
    runpy.run_module("benchmarl.run", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])

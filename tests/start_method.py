"""The test run's processes start through rlcollect's preloaded fork server by default.

Our collectors and envs start their workers through multiprocessing's fork server, which has
imported torch and rlcollect once (`rlcollect.runtime.processes.PRELOADED_MODULES`). TorchRL's
collectors, envs and launchers, which many tests run beside ours as the reference, start theirs
with the process's default start method, "spawn" where none is set: a fresh interpreter per
worker that imports torch, tensordict and TorchRL, about 5 s of CPU on a 2-core machine (a
fifth of the suite's CPU, measured when this was made). Made the default here, the fork server
serves them too: their workers are forked with torch imported and import TorchRL alone. What a
run collects does not depend on how its workers were started; the tests that check a start
method name it.
"""

from __future__ import annotations

import multiprocessing

from rlcollect.runtime.processes import PRELOADED_MODULES


def fork_server_by_default() -> None:
    """Make the fork server, preloaded as rlcollect's workers want it, this process's default
    start method."""
    multiprocessing.set_start_method("forkserver", force=True)
    multiprocessing.set_forkserver_preload(list(PRELOADED_MODULES))

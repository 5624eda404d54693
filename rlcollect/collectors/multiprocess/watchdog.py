"""`Watchdog`: notices a worker that dies while the workers fill the buffer in the background.

Nobody waits on a worker's reply in the background, so without it a death would only be seen
at the user's next call. The watchdog looks every `WATCH_INTERVAL` seconds: it restarts the
dead worker (`restart_dead_workers=True`), or shuts the collector down and keeps the error
(naming the worker and how it died) for the next call to raise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from rlcollect.collectors.multiprocess.pool import WorkerPool

# Seconds between two looks at the workers.
WATCH_INTERVAL = 0.2


class Watchdog:
    """A daemon thread that checks the workers of `pool` while they collect in the background.

    Args:
        pool: the workers.
        is_paused: whether the user paused collection (a restarted worker would not be).
    """

    def __init__(self, pool: WorkerPool, is_paused: Callable[[], bool]) -> None:
        self.pool = pool
        self.is_paused = is_paused
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rlcollect-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL):
            if self.is_paused():
                continue
            with self.pool.lock:
                if self._stop.is_set() or not self.pool.is_open:
                    return
                try:
                    self.pool.check_alive(keep_failure=True)
                except BaseException as err:  # handed to the user's next call
                    if self.pool.failure is None and self.pool.is_open:
                        self.pool.failure = err
                    return

    def stop(self) -> None:
        """Stop looking (and wait for the thread, unless called from it)."""
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join()

"""`BackgroundLoop`: runs a collector's batches in a thread, with pause and prompt shutdown."""

from __future__ import annotations

import atexit
import logging
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rlcollect.errors import MisuseError

logger = logging.getLogger(__name__)


class BackgroundLoop:
    """Calls `run_batch()` in a daemon thread until it returns False or `shutdown()` is called.

    `pause()` is a context manager: on entry it waits for the batch in flight to finish, and no
    batch runs until it exits. `run_batch` polls `stop_requested` to abandon a batch early. An
    exception in the thread stops the loop; it is logged at once and raised again by the next
    `start()`, `pause()` or `shutdown()`.
    """

    def __init__(self, run_batch: Callable[[], bool], name: str = "rlcollect-collector") -> None:
        self._run_batch = run_batch
        self._name = name
        self._lock = threading.Lock()
        self._resume = threading.Event()
        self._resume.set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._paused = False
        self.error: BaseException | None = None

    def stop_requested(self) -> bool:
        """Whether `shutdown()` was called: the batch in flight may be abandoned."""
        return self._stop.is_set()

    @property
    def is_running(self) -> bool:
        """Whether the thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def is_busy(self) -> bool:
        """Whether the thread may be collecting now: running and not held by `pause()`."""
        return self.is_running and not self._paused

    def start(self) -> None:
        """Start the thread; starting twice is an error, and so is an unreported failure of
        the previous run (raised here rather than by a later `pause()`)."""
        if self.is_running:
            raise MisuseError("the collector is already running in the background.")
        self.raise_error()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()
        # Registered after the env's own exit hooks, so it runs before them: the thread stops
        # before the env (e.g. a ParallelEnv's workers) is closed under it.
        atexit.register(self._stop_at_exit)

    def _stop_at_exit(self, timeout: float | None = 10.0) -> None:
        """Stop the thread and wait up to `timeout` seconds; registered for interpreter exit,
        when nobody shut it down (its errors are logged, not raised)."""
        self._stop.set()
        self._resume.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._resume.wait()
                # Poll the lock: a shutdown() called inside pause() must not wait for it.
                while not self._lock.acquire(timeout=0.05):
                    if self._stop.is_set():
                        return
                try:
                    if self._stop.is_set() or not self._run_batch():
                        return
                finally:
                    self._lock.release()
        except BaseException as err:  # reported to the caller by shutdown() / pause()
            self.error = err
            logger.error("background collection failed:\n%s", traceback.format_exc())

    @contextmanager
    def pause(self) -> Iterator[None]:
        """Hold the loop between batches for the duration of the `with` block."""
        self._resume.clear()
        try:
            with self._lock:
                self.raise_error()
                self._paused = True
                try:
                    yield
                finally:
                    self._paused = False
        finally:
            self._resume.set()

    def shutdown(self, timeout: float | None = None) -> None:
        """Ask the thread to stop and wait up to `timeout` seconds for it to end.

        Safe inside `pause()`: the thread then ends without running another batch.
        """
        atexit.unregister(self._stop_at_exit)
        self._stop_at_exit(timeout)
        self.raise_error()

    def raise_error(self) -> None:
        """Raise, once, the error that stopped the thread."""
        error, self.error = self.error, None
        if error is not None:
            raise RuntimeError(f"background collection failed: {error!r}") from error

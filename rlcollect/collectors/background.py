"""`BackgroundLoop`: runs a collector's batches in a thread, with pause and prompt shutdown."""

from __future__ import annotations

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
    batch runs until it exits. An exception in the thread stops the loop; it is logged at once
    and raised again by `shutdown()` and `pause()`.
    """

    def __init__(self, run_batch: Callable[[], bool], name: str = "rlcollect-collector") -> None:
        self._run_batch = run_batch
        self._name = name
        self._lock = threading.Lock()
        self._resume = threading.Event()
        self._resume.set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    @property
    def is_stopping(self) -> bool:
        """Whether the thread runs but was told to stop: a batch it finishes must not be written."""
        return self._stop.is_set() and self.is_running

    @property
    def is_running(self) -> bool:
        """Whether the thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread; starting twice is an error."""
        if self.is_running:
            raise MisuseError("the collector is already running in the background.")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._resume.wait()
                with self._lock:
                    if self._stop.is_set() or not self._run_batch():
                        return
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
                yield
        finally:
            self._resume.set()

    def shutdown(self, timeout: float | None = None) -> None:
        """Ask the thread to stop and wait up to `timeout` seconds for it to end.

        The batch in flight is finished but, when `run_batch` checks `is_stopping`, not written,
        so that nothing reaches the buffer once `shutdown` has returned.
        """
        self._stop.set()
        self._resume.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.raise_error()

    def raise_error(self) -> None:
        """Raise, once, the error that stopped the thread."""
        error, self.error = self.error, None
        if error is not None:
            raise RuntimeError(f"background collection failed: {error!r}") from error

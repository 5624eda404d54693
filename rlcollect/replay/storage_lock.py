"""A lock that serializes storage transactions across threads and, optionally, processes."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any


class StorageLock:
    """A re-entrant lock over threads, and over processes when given a lock file.

    The process part is an exclusive ``flock`` on ``path``: the kernel releases it when its
    holder dies, so a writer killed mid-transaction never blocks the others (the next holder
    repairs the storage through ``on_acquire``). Each process opens the lock file itself, also
    after ``fork``, since ``flock`` does not exclude holders of one shared file description.

    Args:
        path: the lock file shared by the processes, or ``None`` for a thread-only lock.
        on_acquire: called each time the lock is taken from the outside (depth 0 to 1).

    Examples:
        >>> lock = StorageLock()
        >>> with lock, lock:  # re-entrant
        ...     pass
    """

    def __init__(
        self, path: str | None = None, on_acquire: Callable[[], Any] | None = None
    ) -> None:
        self.path = path
        self.on_acquire = on_acquire
        self._reset()

    def _reset(self) -> None:
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._fd: int | None = None
        self._pid = os.getpid()

    def __enter__(self) -> StorageLock:
        if self._pid != os.getpid():
            # A forked child must neither share the parent's descriptor nor inherit a thread
            # lock that another parent thread held at fork time.
            self._reset()
        self._thread_lock.acquire()
        if self._depth == 0:
            try:
                if self.path is not None:
                    fcntl.flock(self._descriptor(self.path), fcntl.LOCK_EX)
                self._depth = 1
                if self.on_acquire is not None:
                    self.on_acquire()
            except BaseException:
                self._release_outer()
                raise
        else:
            self._depth += 1
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._depth == 1:
            self._release_outer()
        else:
            self._depth -= 1
            self._thread_lock.release()

    def _release_outer(self) -> None:
        self._depth = 0
        try:
            if self.path is not None and self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()

    def _descriptor(self, path: str) -> int:
        if self._fd is None:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        return self._fd

    def close(self) -> None:
        """Closes the lock file descriptor of this process (the lock must not be held)."""
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = None

    def __getstate__(self) -> dict[str, Any]:
        # The owner re-binds ``on_acquire`` after unpickling; pickling it would pickle the owner.
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self.on_acquire = None
        self._reset()

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            self.close()

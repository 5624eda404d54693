"""The small exception hierarchy of rlcollect: misuse and worker failures."""

from __future__ import annotations


class RLCollectError(Exception):
    """Base class of every error rlcollect raises on its own account."""


class MisuseError(RLCollectError, RuntimeError):
    """An object was used in a way its contract forbids (e.g. stepping a closed env)."""


class WorkerError(RLCollectError, RuntimeError):
    """A worker process failed; the message carries the worker's own traceback."""

    def __init__(self, worker: int, message: str, remote_traceback: str = "") -> None:
        self.worker = worker
        self.remote_traceback = remote_traceback
        text = f"worker {worker} failed: {message}"
        if remote_traceback:
            text += f"\n--- traceback in worker {worker} ---\n{remote_traceback}"
        super().__init__(text)


class EnvContractError(RLCollectError, AssertionError):
    """An env broke its contract; raised by `rlcollect.testing.check_env`."""

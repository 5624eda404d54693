"""The small exception hierarchy of rlcollect: misuse and worker failures."""

from __future__ import annotations


class RLCollectError(Exception):
    """Base class of every error rlcollect raises on its own account."""


class MisuseError(RLCollectError, RuntimeError):
    """An object was used in a way its contract forbids (e.g. stepping a closed env)."""


class WorkerError(RLCollectError, RuntimeError):
    """A worker process failed; the message carries the worker's own traceback.

    `path` names the failing worker from this process down: `(1,)` for worker 1, `(1, 0)` for
    worker 0 of worker 1 (a worker that runs workers of its own); `worker` is its first index.
    """

    def __init__(
        self, worker: int | tuple[int, ...], reason: str, remote_traceback: str = ""
    ) -> None:
        self.path = (worker,) if isinstance(worker, int) else tuple(worker)
        self.worker = self.path[0]
        self.reason = reason
        self.remote_traceback = remote_traceback
        name = describe_worker_path(self.path)
        text = f"{name} failed: {reason}"
        if remote_traceback:
            text += f"\n--- traceback in {name} ---\n{remote_traceback}"
        super().__init__(text)


class WorkerRaisedError(WorkerError):
    """A worker answered a command with the exception it raised (it is alive and listening).

    `recoverable` says whether the collector goes on: a control command (a seed, a state)
    failed in a healthy worker, rather than a batch or a worker below it.
    """

    recoverable = False


class WorkerTimeoutError(WorkerError):
    """A worker did not answer in time (an env step or a grandchild that never returns)."""


def describe_worker_path(path: tuple[int, ...]) -> str:
    """`worker 1 -> worker 0` for the path `(1, 0)`."""
    return " -> ".join(f"worker {index}" for index in path)


class EnvContractError(RLCollectError, AssertionError):
    """An env broke its contract; raised by `rlcollect.testing.check_env`."""

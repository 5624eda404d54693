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

    def __init__(
        self,
        worker: int | tuple[int, ...],
        reason: str,
        remote_traceback: str = "",
        raised: type[Exception] | None = None,
    ) -> None:
        super().__init__(worker, reason, remote_traceback)
        # The type the worker raised, when a built-in one (TypeError, KeyError, ...).
        self.raised = raised

    def as_raised(self) -> Exception | None:
        """The worker's error as the built-in type it raised (a TypeError stays a TypeError,
        as it would be in this process), naming the worker; None for any other type. Raise
        it `from` this error, whose message carries the worker's traceback."""
        if self.raised is None:
            return None
        return self.raised(f"{describe_worker_path(self.path)} failed: {self.reason}")


class WorkerTimeoutError(WorkerError):
    """A worker did not answer in time (an env step or a grandchild that never returns)."""


def describe_worker_path(path: tuple[int, ...]) -> str:
    """`worker 1 -> worker 0` for the path `(1, 0)`."""
    return " -> ".join(f"worker {index}" for index in path)


class EnvContractError(RLCollectError, AssertionError):
    """An env broke its contract; raised by `rlcollect.testing.check_env`."""

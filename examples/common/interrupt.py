"""`StopOnInterrupt`: Ctrl-C ends a training loop at its next step, so the run still writes
its checkpoint and metrics; a second Ctrl-C stops at once."""

from __future__ import annotations

import logging
import signal
from types import FrameType, TracebackType
from typing import Any

log = logging.getLogger(__name__)  # Hydra sends it to the console and the job log

INTERRUPTED_EXIT_CODE = 130  # what a shell reports for a program ended by Ctrl-C


class StopOnInterrupt:
    """Within `with StopOnInterrupt() as stop:`, SIGINT sets `stop.requested` instead of
    raising `KeyboardInterrupt` wherever the main thread happens to be (half an optimiser
    step, a collector's bookkeeping). The loop checks it once per step and leaves; the run
    then saves what it has. A second SIGINT raises `KeyboardInterrupt` as usual. The previous
    handler comes back on exit.

    Examples:
        >>> import os
        >>> with StopOnInterrupt() as stop:
        ...     os.kill(os.getpid(), signal.SIGINT)
        ...     stop.requested
        True
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        log.warning("interrupted: stopping after this step; Ctrl-C again to stop at once")
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __enter__(self) -> StopOnInterrupt:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def exit_if_requested(self, run_dir: Any) -> None:
        """End the program (exit code 130, a shell's for Ctrl-C) when the run was interrupted;
        call it once the checkpoint and metrics are written."""
        if self.requested:
            log.warning(f"interrupted: the checkpoint and metrics are in {run_dir}")
            raise SystemExit(INTERRUPTED_EXIT_CODE)

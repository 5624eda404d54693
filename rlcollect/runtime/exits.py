"""Prompt exits: the fork server, and a process that Ctrl-C ends, skip Python's last collections.

The last thing a Python interpreter does is collect its garbage, more than once. With torch and
its companions imported that walks some 300,000 objects: 2-3 s with the load average at 4 on
2 cores, over 10 s at 6-12, long after every worker is gone. After Ctrl-C a user waits that
long for the prompt (or kills the job), and the fork server, which exits when its parent does,
lingers as long again. Neither needs those collections:

- the fork server holds nothing but the preloaded modules, so it ends at once
  (`os._exit(0)`) once its parent is gone;
- a process that ends on an uncaught `KeyboardInterrupt`, after our workers are stopped,
  freezes its objects (`gc.freeze()`) at exit: every `atexit` handler still runs and module
  teardown still happens, only the collections skip what is frozen. A program that ends any
  other way exits as Python always does.
"""

from __future__ import annotations

import atexit
import gc
import inspect
import os
import sys
import threading

FORK_SERVER_MODULE = "multiprocessing.forkserver"
_lock = threading.Lock()
_armed = False


def in_fork_server_preload() -> bool:
    """Whether this code runs while multiprocessing's fork server imports its preloaded
    modules (in the server itself, not in a worker it forked)."""
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_globals.get("__name__") == FORK_SERVER_MODULE:
            # The server's own loop is `main`; a forked worker runs below `_serve_one`.
            return frame.f_code.co_name == "main"
        frame = frame.f_back
    return False


def end_fork_server_at_exit() -> None:
    """In the fork server: skip the interpreter's teardown when the server exits."""
    atexit.register(os._exit, 0)


def is_ending_on_interrupt() -> bool:
    """Whether the interpreter is ending on an uncaught `KeyboardInterrupt` (Python stores
    the uncaught exception in `sys.last_value` before the `atexit` handlers run)."""
    return isinstance(getattr(sys, "last_value", None), KeyboardInterrupt)


def _freeze_if_interrupted() -> None:
    if is_ending_on_interrupt():
        gc.freeze()


def exit_promptly_on_interrupt() -> None:
    """Have this process skip its last garbage collections when Ctrl-C ends it (once per
    process; later calls do nothing). Called by whatever starts workers."""
    global _armed
    with _lock:
        if not _armed:
            atexit.register(_freeze_if_interrupted)
            _armed = True


# Whether this module was imported by a fork server's preload: True in the server, and in the
# workers it forks (which end with `os._exit` and never run `atexit` handlers).
LOADED_BY_FORK_SERVER = in_fork_server_preload()
if LOADED_BY_FORK_SERVER:
    end_fork_server_at_exit()

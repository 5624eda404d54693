"""Workers of workers come from the fork server their parent came from.

A worker that starts workers of its own (a nested collector's, a `ParallelEnv` in a worker)
would, left to Python, start a fork server of its own: a fresh interpreter that imports torch
and rlcollect again, several seconds of CPU and of start-up per such worker. Yet a process that
multiprocessing's fork server forked already knows that server: it inherits the server's
address and holds its "alive" pipe (the server runs while any process it forked does). Python
only lacks the server's pid there, so `ensure_running` starts a new server. In such a process,
`share_parent_fork_server` has the workers it starts forked by the same server.
"""

from __future__ import annotations

import multiprocessing.forkserver
import multiprocessing.resource_tracker
import sys

# Python 3.14 authenticates each request with a key the server's starter holds (not its
# children), so from 3.14 on a worker starts its own server as Python does.
SHARED_BELOW = (3, 14)


def forked_by_fork_server() -> bool:
    """Whether this process was forked by a fork server it did not start (it knows the
    server's address and holds its alive pipe, but not its pid)."""
    server = multiprocessing.forkserver._forkserver
    return (
        server._forkserver_address is not None
        and server._forkserver_alive_fd is not None
        and server._forkserver_pid is None
    )


def can_share_parent_fork_server() -> bool:
    """Whether `share_parent_fork_server` has this process's workers forked by the server
    that forked this process (before Python 3.14, in a process such a server forked)."""
    return sys.version_info < SHARED_BELOW and forked_by_fork_server()


def share_parent_fork_server() -> None:
    """In a process forked by a fork server: the workers it starts are forked by that server
    too (instead of by a new one). Elsewhere, and from Python 3.14 on, nothing changes."""
    if not can_share_parent_fork_server():
        return
    server = multiprocessing.forkserver._forkserver
    start_own = server.ensure_running
    if getattr(start_own, "shares_parent_server", False):  # done already
        return

    def ensure_running() -> None:
        if forked_by_fork_server():
            multiprocessing.resource_tracker.ensure_running()
        else:  # a server this process started itself
            start_own()

    ensure_running.shares_parent_server = True  # type: ignore[attr-defined]
    server.ensure_running = ensure_running  # type: ignore[method-assign]

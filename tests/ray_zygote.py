"""Ray worker processes forked from a preloaded interpreter, for the test run's cluster (tests
only).

Ray starts every worker (each actor: a collector, a replay-buffer server, an evaluator) as a
fresh `python default_worker.py ...`, which then imports torch, tensordict and rlcollect: about
6 s of CPU per actor on a 2-core machine, most of what a Ray test costs. The session's cluster
(tests/ray_session.py) starts its node's Python processes through this file, the launcher:

- `python -m tests.ray_zygote serve <socket>` (the *zygote*, started by the `ray_cluster`
  fixture) imports torch, tensordict and rlcollect once (not Ray: its C++ core reads its
  settings from the environment when it loads), then for each launcher that connects forks a
  child that runs `default_worker.py` as `python default_worker.py <args>` would: its
  `__main__`, `sys.argv`, `sys.path[0]`, the launcher's environment, working directory, stdin,
  stdout and stderr. Nothing here runs torch before the fork.
- `python -S tests/ray_zygote.py <socket> <args>` (the *launcher*, what the node runs for
  `python <args>`): for a Ray worker it asks the zygote for that child, passes on SIGTERM and
  SIGINT, and exits with the child's status; the child ends when the launcher does (it
  watches a pipe only the launcher holds), so a raylet that kills a worker's process kills
  the worker. Anything else, or where the zygote cannot be reached, it execs `python <args>`.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import struct
import sys
from collections.abc import Callable

LENGTH = struct.Struct("<I")
# stdin, stdout, stderr and the lifeline's read end travel with each request.
PASSED_FDS = 4
# The script of Ray's Python workers (the only processes forked from the zygote).
RAY_WORKER = "default_worker.py"


# --- launcher (run by Ray's raylet: stdlib only, no site-packages) ------------------------------


def launch(socket_path: str, argv: list[str]) -> None:
    """Run `python <argv>` in a child of the zygote at `socket_path` and exit as it does;
    anything but a Ray worker is exec'd as `python <argv>`."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if not argv or os.path.basename(argv[0]) != RAY_WORKER:
            raise OSError("not a Ray worker")
        connection.connect(socket_path)
    except OSError:
        os.execv(sys.executable, [sys.executable, *argv])
    # The child exits at EOF on the lifeline: when this process ends, which alone holds the
    # write end (open until then).
    lifeline_reader, _lifeline = os.pipe()
    request = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    socket.send_fds(connection, [LENGTH.pack(len(request)) + request], [0, 1, 2, lifeline_reader])
    os.close(lifeline_reader)
    replies = connection.makefile("r")
    reply = replies.readline()  # "started <pid>" (or "exited <status>" already, or "")
    if reply.startswith("started "):
        child = int(reply.split()[1])

        def forward(signum: int, frame: object) -> None:
            os.kill(child, signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        reply = replies.readline()  # "exited <status>", or "" if the zygote died
    status = int(reply.split()[1]) if reply.startswith("exited ") else 1
    os._exit(status if status >= 0 else 128 - status)


# --- zygote ---------------------------------------------------------------------------------------


def preload() -> None:
    """What every worker of the test run imports, Ray aside: imported once, here. Ray's C++
    core reads its settings (the cluster's auth token among them) from the environment when
    it loads, so each child imports Ray itself, with the environment the raylet gave it."""
    import gymnasium  # noqa: F401
    import tensordict.nn  # noqa: F401
    import torch  # noqa: F401

    import rlcollect.collectors.ray.actor
    import rlcollect.replay  # noqa: F401

    if "ray" in sys.modules:
        raise RuntimeError("the Ray worker zygote must not import Ray (see preload())")


def receive_request(connection: socket.socket) -> tuple[dict, list[int]]:
    """A launcher's request and the descriptors that came with it."""
    data, fds, _, _ = socket.recv_fds(connection, 65536, PASSED_FDS)
    (length,) = LENGTH.unpack_from(data)
    data = data[LENGTH.size :]
    while len(data) < length:
        more = connection.recv(length - len(data))
        if not more:
            raise EOFError("the launcher closed its connection mid-request")
        data += more
    return json.loads(data), fds


def run_child(request: dict, fds: list[int], connection: socket.socket) -> None:
    """In the forked child: become `python <argv>`, then exit with its status (the zygote
    tells the launcher)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # as in a fresh interpreter
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
        os.close(fd)
    lifeline = fds[3]
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    connection.sendall(f"started {os.getpid()}\n".encode())

    import runpy
    import threading

    def exit_when_launcher_ends() -> None:
        try:
            os.read(lifeline, 1)
        finally:
            os._exit(1)

    threading.Thread(target=exit_when_launcher_ends, daemon=True).start()
    script = os.path.abspath(request["argv"][0])
    sys.argv = [script, *request["argv"][1:]]
    sys.path[0] = os.path.dirname(script)
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as end:
        code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def serve(socket_path: str) -> None:
    """Fork a child per launcher until stdin closes (the `ray_cluster` fixture's end)."""
    preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    waker_reader, waker = os.pipe()  # SIGCHLD wakes the loop: a child to reap
    os.set_blocking(waker, False)
    signal.set_wakeup_fd(waker)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    launchers: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    for source in (listener, waker_reader, sys.stdin):
        selector.register(source, selectors.EVENT_READ)

    def close_in_child() -> None:
        selector.close()
        listener.close()
        signal.set_wakeup_fd(-1)
        for fd in (waker_reader, waker):
            os.close(fd)
        for other in launchers.values():
            other.close()

    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        for key, _ in selector.select():
            if key.fileobj is sys.stdin and not sys.stdin.readline():
                return
            if key.fileobj is waker_reader:
                os.read(waker_reader, 4096)
            elif key.fileobj is listener:
                fork_for(listener.accept()[0], launchers, close_in_child)
        reap(launchers)


def fork_for(
    connection: socket.socket, launchers: dict[int, socket.socket], close_in_child: Callable
) -> None:
    """Fork the child a launcher asks for on `connection` (kept in `launchers` by its pid)."""
    try:
        request, fds = receive_request(connection)
    except (OSError, EOFError, ValueError):
        connection.close()
        return
    pid = os.fork()
    if pid == 0:
        close_in_child()
        run_child(request, fds, connection)
    for fd in fds:
        os.close(fd)
    launchers[pid] = connection


def reap(launchers: dict[int, socket.socket]) -> None:
    """Tell each launcher whose child has ended how it ended."""
    while launchers:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = launchers.pop(pid, None)
        if connection is not None:
            with contextlib.suppress(OSError):
                connection.sendall(f"exited {os.waitstatus_to_exitcode(status)}\n".encode())
            connection.close()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        launch(sys.argv[1], sys.argv[2:])

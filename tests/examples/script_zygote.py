"""A preloaded interpreter that forks one child per example-script run (tests only).

A fresh interpreter that imports torch, tensordict and rlcollect costs about 6 s of CPU on a
2-core machine, most of an example test's short run. This program imports them once; for each
request it forks a child that runs the script as `python <script> <args>` would: its own
`__main__`, `sys.argv` and `sys.path[0]`, the environment and working directory given, stdin
from /dev/null, stdout and stderr to the files given, and the exit status of a script run
(SystemExit's code; 1 and the traceback for an uncaught exception). What the fork shares with
a fresh interpreter's run is the state of the modules imported here, which is their import-time
state: nothing here runs torch, Hydra or a collector.

Protocol, one line each, over this process's stdin and stdout: a JSON request
`{"argv", "env", "cwd", "stdout", "stderr"}` in, and optionally `"before"`: a Python file the
child runs first, as a `sitecustomize` would run at a fresh interpreter's start-up (the extras
tests block imports this way); `started <pid>` and then `exited <status>` out (the status as
`subprocess` gives it: negative for a signal).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from typing import IO

import gymnasium  # noqa: F401  (preloaded for the children)
import hydra  # noqa: F401
import numpy  # noqa: F401
import omegaconf  # noqa: F401
import tensordict
import tensordict.nn  # noqa: F401
import torch  # noqa: F401

import rlcollect  # noqa: F401


def run_child(request: dict, channels: list[IO[str]]) -> None:
    """In the forked child: become `python <argv>` (returns when the script returns)."""
    for channel in channels:
        channel.close()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    os.close(null)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if os.environ.get("PYTHONUNBUFFERED"):  # read at start-up: output flushed line by line
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    if request.get("before"):
        runpy.run_path(request["before"], run_name="sitecustomize")
    script = os.path.abspath(request["argv"][0])
    sys.argv = [script, *request["argv"][1:]]
    sys.path[0] = os.path.dirname(script)
    # As a fresh `python <script>` would: run it as __main__, and let the interpreter end
    # (atexit handlers, flushed streams) with the script's exit status.
    runpy.run_path(script, run_name="__main__")


def serve() -> None:
    """Answer requests until stdin closes; each child is waited for before the next."""
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    null = os.open(os.devnull, os.O_RDWR)  # stray output of this process goes nowhere
    for fd in (0, 1):
        os.dup2(null, fd)
    os.close(null)
    for line in requests:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_child(request, [requests, replies])
            return  # the script returned: the interpreter ends with status 0
        replies.write(f"started {pid}\n")
        _, status = os.waitpid(pid, 0)
        replies.write(f"exited {os.waitstatus_to_exitcode(status)}\n")


if __name__ == "__main__":
    serve()

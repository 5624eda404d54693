"""Runs an example script with Hydra overrides, as a user would from the shell.

Each run is a child of this test process's script zygote (tests/examples/script_zygote.py): an
interpreter that has imported torch, tensordict and rlcollect once and forks a child per run,
which runs the script as `python examples/<script>.py ...` would. A fresh interpreter costs
about 6 s of CPU on a 2-core machine, most of a short run. The tests that check what only a
fresh interpreter shows (Ctrl-C, the README's commands) start one.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"
# How the zygote shows in a process listing (tests/conftest.py leaves it out of the leftovers).
ZYGOTE_MODULE = "tests.examples.script_zygote"


class ScriptZygote:
    """This process's zygote: started at the first run, ended when this process exits."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", ZYGOTE_MODULE],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        # Its replies, line by line, read by a thread: a deadline on a queue, not on a pipe
        # whose reader may already hold the next line in its buffer.
        self.replies: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read_replies, daemon=True).start()
        atexit.register(self.close)

    def _read_replies(self) -> None:
        for line in self.process.stdout:  # type: ignore[union-attr]
            self.replies.put(line.strip())
        self.replies.put(None)  # the zygote ended

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()  # type: ignore[union-attr]
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def reply(self, deadline: float | None) -> str:
        """The zygote's next line, or "" when `deadline` (a monotonic time) passes first."""
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            line = self.replies.get(timeout=left)
        except queue.Empty:
            return ""
        if line is None:
            raise RuntimeError(f"the script zygote ended (exit code {self.process.wait()})")
        return line

    def run(
        self, argv: list[str], env: dict[str, str], timeout: float, before: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run `python <argv>` in a forked child; as `subprocess.run(..., timeout=timeout)`.
        `before`: a Python file the child runs first, as a `sitecustomize` at start-up."""
        with tempfile.TemporaryDirectory(prefix="script-run-") as outputs:
            paths = {name: os.path.join(outputs, name) for name in ("stdout", "stderr")}
            request = {"argv": argv, "env": env, "cwd": str(REPO_ROOT), **paths}
            if before is not None:
                request["before"] = str(before)
            self.process.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
            pid = 0
            try:
                pid = int(self.reply(None).removeprefix("started "))
                ended = self.reply(time.monotonic() + timeout)
                if not ended:
                    kill(pid)
                    self.reply(None)
            except BaseException:  # a run cut short (the test's timeout): end it, and this zygote
                if not pid:  # cut short before the zygote said which child it started
                    with contextlib.suppress(RuntimeError, ValueError):
                        pid = int(self.reply(time.monotonic() + 5).removeprefix("started ") or 0)
                kill(pid)
                self.process.kill()
                self.process.wait()
                raise
            output = {name: Path(path).read_text(errors="replace") for name, path in paths.items()}
        if not ended:
            raise subprocess.TimeoutExpired(argv, timeout, output["stdout"], output["stderr"])
        code = int(ended.removeprefix("exited "))
        return subprocess.CompletedProcess(argv, code, output["stdout"], output["stderr"])


def kill(pid: int) -> None:
    """SIGKILL to a script run (gone already when it ended just now; 0: none started)."""
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


_zygote: ScriptZygote | None = None


def zygote() -> ScriptZygote:
    """This process's zygote, started (again) when it has none running."""
    global _zygote
    if _zygote is None or _zygote.process.poll() is not None:
        _zygote = ScriptZygote()
    return _zygote


def run_script(
    script: str, run_dir: Path, *overrides: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`python examples/<script>.py hydra.run.dir=<run_dir> <overrides>` from the repo root."""
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0"}
    argv = [str(EXAMPLES / f"{script}.py"), f"hydra.run.dir={run_dir}", *overrides]
    return zygote().run(argv, environment, timeout)


def check_succeeded(result: subprocess.CompletedProcess[str]) -> None:
    """Fail with the script's output when it did not exit cleanly."""
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def checkpoint_frames(run_dir: Path) -> int:
    """The frame count stored in a run's checkpoint."""
    state = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    return int(state["frames"])


def check_run_outputs(run_dir: Path) -> None:
    """A run left its metrics CSV, its plot (a PNG) and its checkpoint."""
    header = (run_dir / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"frames", "mean_episode_return", "mean_return_last_100"} <= set(header), header
    assert (run_dir / "return.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (run_dir / "checkpoint.pt").is_file()

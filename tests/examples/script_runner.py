"""Runs an example script in a subprocess with Hydra overrides, as a user would from the shell."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"


def run_script(
    script: str, run_dir: Path, *overrides: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`python examples/<script>.py hydra.run.dir=<run_dir> <overrides>` from the repo root."""
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / f"{script}.py"), f"hydra.run.dir={run_dir}", *overrides],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


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

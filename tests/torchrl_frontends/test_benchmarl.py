"""BenchMARL 1.5.2 on our collectors: `python -m rlcollect.patch -m benchmarl.run` logs the same
returns as BenchMARL on TorchRL's own `Collector`, under the same seed.

BenchMARL 1.5.2 pins `torchrl<0.12` and imports `SyncDataCollector`, which TorchRL 0.14.1
removed: it is installed beside TorchRL 0.14.1 without its dependencies (docs/guide/benchmarl.md,
scripts/rlc.sh). Both sides run MAPPO on VMAS's balance for two iterations of 160 frames (four
envs, 20-step episodes, so every env ends two episodes per batch and the second batch is
collected with the weights the first trained).
"""

from __future__ import annotations

import csv
import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.torchrl_frontends.benchmarl_probe.sitecustomize import BUILT

# CI (scripts/rlc.sh test) installs BenchMARL and says so in this variable: there, BenchMARL
# missing is a broken install, not a reason to skip.
FULL_INSTALL = "RLCOLLECT_FULL_TEST_INSTALL"
MISSING = [name for name in ("benchmarl", "vmas") if importlib.util.find_spec(name) is None]
if MISSING:
    if os.environ.get(FULL_INSTALL) == "1":
        pytest.fail(
            f"{FULL_INSTALL}=1 but {MISSING} is not installed; install the BenchMARL recipe of "
            "docs/guide/benchmarl.md (scripts/rlc.sh does).",
            pytrace=False,
        )
    pytest.skip(f"{MISSING} not installed (docs/guide/benchmarl.md)", allow_module_level=True)

REFERENCE_SCRIPT = Path(__file__).with_name("benchmarl_on_torchrl.py")
# Its sitecustomize makes each run print the class of the collector BenchMARL built.
PROBE = Path(__file__).with_name("benchmarl_probe")
ITERATIONS = 2
OVERRIDES = [
    "algorithm=mappo",
    "task=vmas/balance",
    "task.max_steps=20",
    "seed=0",
    "experiment.max_n_frames=320",
    "experiment.on_policy_collected_frames_per_batch=160",
    "experiment.on_policy_n_envs_per_worker=4",
    "experiment.on_policy_n_minibatch_iters=1",
    "experiment.on_policy_minibatch_size=80",
    "experiment.sampling_device=cpu",
    "experiment.train_device=cpu",
    "experiment.evaluation=false",
    "experiment.render=false",
    "experiment.loggers=[csv]",
    "experiment.create_json=false",
    "experiment.checkpoint_interval=0",
    "experiment.checkpoint_at_end=false",
]
RETURNS = "collection_reward_episode_reward_mean"
PATCH_BUILT = re.compile(r"rlcollect\.patch: pid \d+ built (\S+)")


def run_benchmarl(launch: list[str], folder: Path, env: dict[str, str]) -> str:
    """Run `python <launch> <OVERRIDES>` logging into `folder`; what it printed (both streams)."""
    folder.mkdir()
    command = [
        sys.executable,
        *launch,
        *OVERRIDES,
        f"experiment.save_folder={folder}",
        f"hydra.run.dir={folder / 'hydra'}",
    ]
    done = subprocess.run(
        command, cwd=folder, env=env, capture_output=True, text=True, timeout=140, check=False
    )
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done.stdout + done.stderr


def built(output: str) -> list[str]:
    """The classes of the collectors BenchMARL built, as the probe printed them."""
    return [line.split()[-1] for line in output.splitlines() if line.startswith(BUILT)]


def logged(folder: Path) -> dict[str, list[float]]:
    """Every scalar BenchMARL's csv logger wrote under `folder`, but its timers: name -> values."""
    (scalars,) = folder.glob("*/*/scalars")
    series = {}
    for path in sorted(scalars.glob("*.csv")):
        if not path.stem.startswith("timers_"):
            with path.open(newline="") as file:
                series[path.stem] = [float(value) for _, value in csv.reader(file)]
    return series


@pytest.mark.slow
@pytest.mark.timeout(330)
@pytest.mark.usefixtures("nothing_left_at_os_level")
def test_benchmarl_mappo_logs_the_same_returns_on_our_collectors(tmp_path: Path) -> None:
    path = os.pathsep.join([str(PROBE), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {
        **os.environ,
        "PYTHONPATH": path,
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
        "HYDRA_FULL_ERROR": "1",
        "RLCOLLECT_PATCH_VERBOSE": "1",
    }
    theirs = run_benchmarl([str(REFERENCE_SCRIPT)], tmp_path / "torchrl", env)
    ours = run_benchmarl(["-m", "rlcollect.patch", "-m", "benchmarl.run"], tmp_path / "ours", env)

    assert built(theirs) == ["torchrl.collectors._single.Collector"], theirs[-3000:]
    assert built(ours) == ["rlcollect.collectors.single.collector.Collector"], ours[-3000:]
    # The patch's own account (RLCOLLECT_PATCH_VERBOSE): one collector built, that one.
    assert PATCH_BUILT.findall(ours) == ["rlcollect.collectors.single.collector.Collector"]

    reference, measured = logged(tmp_path / "torchrl"), logged(tmp_path / "ours")
    returns = reference[RETURNS]
    assert len(returns) == ITERATIONS
    assert all(math.isfinite(value) for value in returns), returns
    assert [round(value, 5) for value in measured[RETURNS]] == [
        round(value, 5) for value in returns
    ]
    # The rest of what BenchMARL logs (rewards, losses, grad norms, counters) matches too.
    assert measured.keys() == reference.keys()
    for name, values in reference.items():
        assert measured[name] == pytest.approx(values, rel=1e-5, abs=1e-6), name

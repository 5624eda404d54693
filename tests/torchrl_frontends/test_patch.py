"""`rlcollect.patch_torchrl()`, `python -m rlcollect.patch` and `RLCOLLECT_PATCH_TORCHRL=1`: a
TorchRL program, TorchRL's config-system trainer and the processes they start build our
collectors; unpatching gives TorchRL's objects back; TorchRL 0.10's names run here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torchrl.collectors")

import torchrl
import torchrl.collectors
import torchrl.collectors.collectors

import rlcollect
from rlcollect.patch import UntestedTorchRLVersionWarning, child_environment, targets

pytestmark = pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "patch_scripts"
PYTHON = sys.executable
BUILT = re.compile(r"rlcollect\.patch: pid (\d+) built (\S+)")
TORCHRL_COLLECTOR = "torchrl.collectors._single"
OUR_COLLECTOR = "rlcollect.collectors.single.collector"
# TorchRL's own names before any test patches (the module is imported unpatched).
TORCHRL_OBJECTS = {
    module.__name__: dict(vars(module))
    for module in (torchrl.collectors, torchrl.collectors.collectors)
}
TORCHRL_ALL = {
    module.__name__: list(module.__all__)
    for module in (torchrl.collectors, torchrl.collectors.collectors)
}


def clean_environment(**extra: str) -> dict[str, str]:
    """This environment without the patch's variables (a test run may itself be patched)."""
    environ = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("RLCOLLECT_PATCH") and name != "PYTHONPATH"
    }
    return environ | {"PYTHONPATH": str(ROOT)} | extra


def run(command: list[str], timeout: float, **variables: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        command,
        cwd=ROOT,
        env=clean_environment(**variables),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def last_json(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


def records(folder: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]


# --- the launcher runs a TorchRL script on our collectors, in every process ---------------------


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_launcher_runs_a_torchrl_script_on_our_collectors_in_every_process(
    tmp_path: Path,
) -> None:
    result = run(
        [
            PYTHON,
            "-m",
            "rlcollect.patch",
            str(SCRIPTS / "collect.py"),
            "spawn",
            "fork",
            "forkserver",
        ],
        timeout=400,
        PATCH_TEST_RECORDS=str(tmp_path),
        RLCOLLECT_PATCH_VERBOSE="1",
    )
    assert last_json(result.stdout) == {
        "built": "rlcollect.collectors.multiprocess.sync_collector",
        "batches": [20, 20, 40, 40],
    }
    seen = records(tmp_path)
    main_pid = next(line["pid"] for line in seen if line["role"] == "main")
    roles = {line["role"] for line in seen}
    assert {"main", "env", "child-spawn", "child-fork", "child-forkserver"} <= roles
    # the multi-process collector's workers built their envs in processes of their own
    assert {line["pid"] for line in seen if line["role"] == "env"} - {main_pid}
    for line in seen:  # every process resolves TorchRL's names, and the old ones, to ours
        assert line["Collector"] == "rlcollect.collectors.single.collector", line
        assert line["MultiSyncCollector"] == "rlcollect.collectors.multiprocess.sync_collector"
        assert line["MultiAsyncCollector"] == "rlcollect.collectors.multiprocess.async_collector"
        assert line["SyncDataCollector"] == "rlcollect.collectors.single.collector", line
    # said once (not once per worker), and a line per collector built, naming ours and the pid
    assert result.stderr.count("collectors run on rlcollect") == 1
    built = BUILT.findall(result.stderr)
    assert (str(main_pid), "rlcollect.collectors.single.collector.Collector") in built
    assert (
        str(main_pid),
        "rlcollect.collectors.multiprocess.sync_collector.MultiSyncCollector",
    ) in built
    assert all(name.startswith("rlcollect.") for _, name in built)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_launcher_runs_a_module_as_main(tmp_path: Path) -> None:
    module = "tests.torchrl_frontends.patch_scripts.collect"
    result = run(
        [PYTHON, "-m", "rlcollect.patch", "-m", module, "--no-multi", "fork"],
        timeout=280,
        PATCH_TEST_RECORDS=str(tmp_path),
    )
    assert last_json(result.stdout)["built"] == "rlcollect.collectors.single.collector"
    seen = records(tmp_path)
    assert {line["role"] for line in seen} == {"main", "env", "child-fork"}
    assert {line["Collector"] for line in seen} == {"rlcollect.collectors.single.collector"}


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_launcher_runs_torchrls_ppo_trainer_config_on_our_collectors() -> None:
    pytest.importorskip("hydra")
    pytest.importorskip("torchrl.trainers")
    result = run(
        [PYTHON, "-m", "rlcollect.patch", str(SCRIPTS / "ppo_trainer.py")],
        timeout=400,
        RLCOLLECT_PATCH_VERBOSE="1",
    )
    report = last_json(result.stdout)
    assert report["target"] == "torchrl.collectors.MultiSyncCollector"  # TorchRL's own target
    assert (
        report["collector"] == "rlcollect.collectors.multiprocess.sync_collector.MultiSyncCollector"
    )
    assert report["collected_frames"] == report["expected_frames"]  # trained to the end
    output = result.stdout + result.stderr  # Hydra's logging may take the main process's lines
    built = BUILT.findall(output)
    assert any(name.endswith("MultiSyncCollector") for _, name in built)
    # the collector's workers, processes of their own, built our classes too
    assert len({pid for pid, _ in built}) >= 3, built
    assert all(name.startswith("rlcollect.") for _, name in built)


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("route", ["launcher", "runtime_env"])
def test_a_ray_actor_resolves_torchrls_names_to_ours(route: str) -> None:
    """A cluster the patched driver starts inherits its variables; a job unpatched itself
    hands them to its workers in its `runtime_env` (`rlcollect.patch.environment_variables`)."""
    pytest.importorskip("ray")
    from tests.ray_session import SUBPROCESS_ENV

    script = str(SCRIPTS / "ray_actor.py")
    command = (
        [PYTHON, "-m", "rlcollect.patch", script]
        if route == "launcher"
        else [PYTHON, script, "--runtime-env"]
    )
    found = last_json(run(command, timeout=400, **SUBPROCESS_ENV).stdout)
    assert found["Collector"] == OUR_COLLECTOR
    assert found["pid"] != found["driver_pid"]
    assert not found["driver_imported_torchrl_collectors"]  # the actor patched itself


# --- RLCOLLECT_PATCH_TORCHRL=1 at interpreter start ---------------------------------------------

PROBE = """
import json, sys
at_start = {name: name in sys.modules for name in ("rlcollect", "torch", "torchrl")}
import torchrl.collectors
print(json.dumps({**at_start, "Collector": torchrl.collectors.Collector.__module__}))
"""
NOTHING_IMPORTED = {"rlcollect": False, "torch": False, "torchrl": False}


@pytest.fixture(scope="module")
def hooked_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python environment over ours with the `.pth` line of `--install-hook` (written by
    the launcher run from that environment), as a regular install would have it."""
    folder = tmp_path_factory.mktemp("venv")
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=60)
    python = folder / "bin" / "python"
    (site_packages,) = folder.glob("lib/python*/site-packages")
    ours = sysconfig.get_paths()["purelib"]
    (site_packages / "00-over-rlcollects-venv.pth").write_text(
        f"import site; site.addsitedir({ours!r})\n"
    )
    result = run([str(python), "-m", "rlcollect.patch", "--install-hook"], timeout=120)
    assert result.stdout.strip() == f"wrote {site_packages / child_environment.PTH_NAME}"
    return str(python)


# The tests over hooked_python share one pytest-xdist worker, so that it is built once.
@pytest.mark.xdist_group("hooked_python")
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_variable_patches_a_plain_python_when_torchrl_is_imported(hooked_python: str) -> None:
    patched = last_json(
        run([hooked_python, "-c", PROBE], timeout=280, RLCOLLECT_PATCH_TORCHRL="1").stdout
    )
    # the hook imported nothing at start: the patch waited for TorchRL's collectors
    assert patched == {**NOTHING_IMPORTED, "Collector": OUR_COLLECTOR}


@pytest.mark.xdist_group("hooked_python")
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_without_the_variable_the_hook_imports_nothing(hooked_python: str) -> None:
    plain = last_json(run([hooked_python, "-c", PROBE], timeout=280).stdout)
    assert plain == {**NOTHING_IMPORTED, "Collector": TORCHRL_COLLECTOR}
    result = run([hooked_python, "-m", "rlcollect.patch", "--uninstall-hook"], timeout=120)
    assert result.stdout.startswith("removed ")
    assert not any(Path(hooked_python).parents[1].glob(f"lib/*/*/{child_environment.PTH_NAME}"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_launchers_pythonpath_patches_children_and_keeps_their_sitecustomize(
    tmp_path: Path,
) -> None:
    """What a process started by the launcher (or after `patch_torchrl()`) inherits."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = '1'\n")
    variables = child_environment.child_variables({"PYTHONPATH": f"{theirs}{os.pathsep}{ROOT}"})
    probe = PROBE.replace(
        "print(json.dumps({", "import os\nprint(json.dumps({'theirs': 'THEIRS_RAN' in os.environ, "
    )
    patched = last_json(run([PYTHON, "-c", probe], timeout=280, **variables).stdout)
    assert patched == {"theirs": True, **NOTHING_IMPORTED, "Collector": OUR_COLLECTOR}


# --- patch_torchrl() / unpatch_torchrl() in this process --------------------------------------


def rebound_names() -> list[tuple[str, str]]:
    return [
        (module, name)
        for module in targets.PATCHED_MODULES
        for name in (*targets.CURRENT_NAMES, *targets.LEGACY_NAMES)
        if name in TORCHRL_OBJECTS[module] or name in targets.LEGACY_NAMES
    ]


def test_unpatch_restores_torchrls_objects_exactly() -> None:
    before_environment = dict(os.environ)
    rlcollect.patch_torchrl()
    rlcollect.patch_torchrl()  # twice: nothing more
    try:
        modules = {m.__name__: m for m in (torchrl.collectors, torchrl.collectors.collectors)}
        for module, name in rebound_names():
            assert getattr(modules[module], name) is not TORCHRL_OBJECTS[module].get(name)
        assert torchrl.collectors.Collector is rlcollect.Collector
        assert torchrl.collectors.collectors.MultiSyncCollector is rlcollect.MultiSyncCollector
        assert torchrl.collectors.MultiaSyncDataCollector is rlcollect.MultiaSyncDataCollector
        assert torchrl.collectors.DataCollectorBase is torchrl.collectors.BaseCollector
        assert "SyncDataCollector" in torchrl.collectors.__all__
        assert os.environ["RLCOLLECT_PATCH_TORCHRL"] == "1"  # for the processes started now
    finally:
        rlcollect.unpatch_torchrl()
    rlcollect.unpatch_torchrl()  # twice: nothing more
    for module in (torchrl.collectors, torchrl.collectors.collectors):
        now = vars(module)
        for name, original in TORCHRL_OBJECTS[module.__name__].items():
            assert now[name] is original, f"{module.__name__}.{name}"
        assert not [name for name in targets.LEGACY_NAMES if name in now]
        assert module.__all__ == TORCHRL_ALL[module.__name__]
    assert dict(os.environ) == before_environment
    with pytest.raises(ImportError, match="SyncDataCollector"):
        from torchrl.collectors import SyncDataCollector  # noqa: F401


def test_an_untested_torchrl_version_is_named_in_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torchrl, "__version__", "0.99.0")
    try:
        with pytest.warns(
            UntestedTorchRLVersionWarning, match=r"tested with TorchRL 0\.14\.1.*0\.99\.0"
        ):
            rlcollect.patch_torchrl(children=False)
        assert torchrl.collectors.Collector is rlcollect.Collector  # patched all the same
    finally:
        rlcollect.unpatch_torchrl()
    monkeypatch.setattr(torchrl, "__version__", targets.TESTED_TORCHRL_VERSIONS[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UntestedTorchRLVersionWarning)
        rlcollect.patch_torchrl(children=False)
    rlcollect.unpatch_torchrl()


# --- TorchRL 0.10's names, by changing the import ---------------------------------------------


def test_torchrl_0_14_no_longer_has_the_old_names() -> None:
    assert not rlcollect.patch.is_patched()
    with pytest.raises(ImportError, match="SyncDataCollector"):
        from torchrl.collectors import SyncDataCollector  # noqa: F401
    with pytest.raises(ImportError, match="MultiaSyncDataCollector"):
        from torchrl.collectors import MultiaSyncDataCollector  # noqa: F401


def make_pendulum() -> Any:  # a TorchRL 0.10 tutorial's env maker
    from torchrl.envs import GymEnv, StepCounter, TransformedEnv

    return TransformedEnv(GymEnv("Pendulum-v1"), StepCounter(max_steps=25))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_torchrl_0_10_snippet_runs_by_changing_its_import() -> None:
    # TorchRL 0.10's collectors tutorial, with `from torchrl.collectors import ...` changed
    from tensordict.nn import TensorDictModule
    from torch import nn
    from torchrl.envs.utils import ExplorationType

    from rlcollect import DataCollectorBase, MultiaSyncDataCollector, SyncDataCollector

    env = make_pendulum()
    policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    collector = SyncDataCollector(
        make_pendulum,
        policy,
        frames_per_batch=50,
        total_frames=100,
        max_frames_per_traj=-1,
        split_trajs=False,
        exploration_type=ExplorationType.RANDOM,
        device="cpu",
        storing_device="cpu",
        reset_at_each_iter=False,
        init_random_frames=None,
    )
    assert isinstance(collector, DataCollectorBase)
    assert [batch.shape for batch in collector] == [(50,), (50,)]
    collector.shutdown()
    with pytest.warns(DeprecationWarning, match="replay_buffer_chunk"):
        collector = MultiaSyncDataCollector(
            [make_pendulum, make_pendulum],
            policy,
            frames_per_batch=50,
            total_frames=100,
            update_at_each_batch=True,
            preemptive_threshold=None,
            num_threads=None,
            num_sub_threads=1,
            replay_buffer_chunk=True,
        )
    try:
        frames = sum(batch.numel() for batch in collector)
    finally:
        collector.shutdown()
    assert frames == 100
    assert isinstance(collector, DataCollectorBase)
    del env


def test_replay_buffer_chunk_and_extend_buffer_must_agree() -> None:
    from rlcollect.collectors.legacy_names import with_extend_buffer

    assert with_extend_buffer(None, {"a": 1}) == {"a": 1}
    with (
        pytest.warns(DeprecationWarning, match="old name"),
        pytest.raises(ValueError, match="disagree"),
    ):
        with_extend_buffer(True, {"extend_buffer": False})

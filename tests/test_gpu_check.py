"""The GPU check's scripts (scripts/gpu_check.sh, scripts/gpu_wheels.sh, scripts/gpu/) kept from
rotting between the rare runs on a GPU machine: the check run end to end on CPU with what this
interpreter imports, the offline resolver check's parts on stand-in wheels, and the report's
verdict. The full rehearsal (a fresh venv, wheels downloaded, no network) is
`bash scripts/gpu_dry_run.sh`; it downloads, so it is not run here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "scripts" / "gpu"


def requirement_lines(path: Path) -> list[str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def name_of(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def run_script(*arguments: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *map(str, arguments)], capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_gpu_check_runs_end_to_end_and_writes_its_report(tmp_path: Path) -> None:
    environment = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_SKIP_INSTALL": "1"}
    environment["GPU_CHECK_QUICK"] = "1"
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = (tmp_path / "gpu_report.md").read_text()
    facts = json.loads((tmp_path / "facts.json").read_text())
    assert facts["unmet_requirements"] == []
    assert facts["versions"]["rlcollect"] is not None
    for name in ("rlcollect", "tensordict", "gymnasium", "torchrl", "hydra", "omegaconf"):
        assert facts["imports"][name].startswith("ok"), facts["imports"]
    assert "torchrl._torchrl" in facts["imports"]  # reported, loaded or not (another torch)
    collected = re.search(
        r"(\d+) collected: (\d+) passed, (\d+) skipped, 0 failed, 0 error", report
    )
    assert collected, report
    total, passed, skipped = map(int, collected.groups())
    assert total >= 36  # every gpu-marked test of the suite, none lost to a collection error
    for module in sorted((ROOT / "tests" / "gpu").glob("test_*.py")):
        assert f"`tests.gpu.{module.stem}::" in report, f"no CUDA test of {module.name} ran"
    if not torch.cuda.is_available():
        assert (passed, skipped) == (0, total)
    phases = dict(re.findall(r"^\| (facts|tests|benchmark) \| (\d+) \|", report, re.MULTILINE))
    assert phases == {"facts": "0", "tests": "0", "benchmark": "0"}
    assert "(no benchmark table)" not in report


def test_every_runtime_dependency_is_carried_or_on_the_gpu_machine() -> None:
    requires = metadata.requires("rlcollect") or []
    needed = {name_of(r) for r in requires if "extra ==" not in r}
    # matplotlib draws the examples' plots, which the check does not run
    needed |= {name_of(r) for r in requires if 'extra == "examples"' in r} - {"matplotlib"}
    assert {"torch", "tensordict", "gymnasium", "hydra-core"} <= needed
    needed |= {"torchrl", "pytest", "pytest-timeout"}  # the side-by-side rows, the test run
    carried = [name_of(r) for r in requirement_lines(GPU / "carried.txt")]
    provided = [name_of(r) for r in requirement_lines(GPU / "provided.txt")]
    assert needed <= set(carried) | set(provided)
    assert "torch" not in carried
    assert not set(carried) & set(provided)
    for listed in (carried, provided):
        assert len(listed) == len(set(listed)), "one version of each"
    pins = requirement_lines(GPU / "carried.txt") + requirement_lines(GPU / "provided.txt")
    assert all(re.fullmatch(r"[\w.-]+==[\w.+]+", pin) for pin in pins), pins


def resolve_offline(requirements: list[str], *folders: Path, target: Path) -> dict[str, str]:
    """What pip's resolver picks from `folders` alone, without installing (name -> version)."""
    report = target / "report.json"
    links = [argument for folder in folders for argument in ("--find-links", str(folder))]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
         "--no-index", *links, "--only-binary=:all:", "--target", str(target / "site"),
         "--report", str(report), *requirements],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PIP_CONFIG_FILE": os.devnull},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    chosen = json.loads(report.read_text())["install"]
    return {item["metadata"]["name"]: item["metadata"]["version"] for item in chosen}


def test_stand_in_wheels_let_the_resolver_see_the_machine_packages(tmp_path: Path) -> None:
    listing = tmp_path / "provided.txt"
    listing.write_text("torch==2.11.0\nnumpy==2.5.2\ntyping_extensions==4.15.0\n")
    done = run_script(GPU / "stand_in_wheels.py", listing, tmp_path / "stand-ins")
    assert done.returncode == 0, done.stderr
    chosen = resolve_offline(["torch", "numpy<3"], tmp_path / "stand-ins", target=tmp_path)
    assert chosen == {"torch": "2.11.0", "numpy": "2.5.2"}


def test_the_resolution_check_wants_exactly_the_carried_wheels(tmp_path: Path) -> None:
    listing = tmp_path / "provided.txt"
    listing.write_text("torch==2.11.0\n")
    carried = tmp_path / "carried"
    assert run_script(GPU / "stand_in_wheels.py", listing, tmp_path / "stand-ins").returncode == 0
    (tmp_path / "one.txt").write_text("tqdm==4.67.1\n")
    assert run_script(GPU / "stand_in_wheels.py", tmp_path / "one.txt", carried).returncode == 0
    report = tmp_path / "report.json"

    def judge(*chosen: tuple[str, str]) -> subprocess.CompletedProcess[str]:
        items = [{"metadata": {"name": name, "version": version}} for name, version in chosen]
        report.write_text(json.dumps({"install": items}))
        return run_script(GPU / "check_resolution.py", report, carried, listing)

    assert judge(("torch", "2.11.0"), ("tqdm", "4.67.1")).returncode == 0
    unneeded = judge(("torch", "2.11.0"))
    assert "tqdm-4.67.1-py3-none-any.whl is carried but nothing needs it" in unneeded.stderr
    missing = judge(("torch", "2.11.0"), ("tqdm", "4.67.1"), ("orjson", "3.13.0"))
    assert "orjson is neither carried nor provided" in missing.stderr


def write_check_output(out: Path, *, failed: bool, benchmark_code: int = 0) -> None:
    facts = {
        "python": "3.12.3", "platform": "Linux", "cpus": 16, "torch": "2.11.0",
        "torch_cuda": "13.0", "cuda_available": True, "device_name": "NVIDIA H200",
        "capability": "9.0", "memory_gib": 139.8, "nvidia_smi": "NVIDIA H200",
        "versions": {"rlcollect": "0.1.0"}, "imports": {"rlcollect": "ok"},
        "unmet_requirements": [],
    }  # fmt: skip
    (out / "facts.json").write_text(json.dumps(facts))
    failure = '<failure message="AssertionError: 3 != 1">trace</failure>' if failed else ""
    (out / "gpu_tests.xml").write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.gpu.test_a" name="test_ok"/>'
        f'<testcase classname="tests.gpu.test_a" name="test_bad">{failure}</testcase>'
        "</testsuite></testsuites>"
    )
    (out / "gpu_benchmark.md").write_text("| env | frames/s |\n| --- | --- |\n| CartPole | 1 |\n")
    (out / "phases.tsv").write_text(f"facts\t0\t3\ntests\t0\t60\nbenchmark\t{benchmark_code}\t90\n")


@pytest.mark.parametrize(
    ("failed", "benchmark_code", "verdict"), [(False, 0, 0), (True, 0, 1), (False, 124, 1)]
)
def test_the_report_fails_on_a_failed_test_or_an_unfinished_phase(
    tmp_path: Path, failed: bool, benchmark_code: int, verdict: int
) -> None:
    write_check_output(tmp_path, failed=failed, benchmark_code=benchmark_code)
    done = run_script(GPU / "report.py", tmp_path)
    assert done.returncode == verdict
    page = (tmp_path / "gpu_report.md").read_text()
    assert "GPU: NVIDIA H200 (capability 9.0, 139.8 GiB)" in page
    expected = "2 collected: 1 passed, 0 skipped, 1 failed" if failed else "2 collected: 2 passed"
    assert expected in page
    assert "| CartPole | 1 |" in page
    if failed:
        assert "| `tests.gpu.test_a::test_bad` | failed | AssertionError: 3 != 1 |" in page

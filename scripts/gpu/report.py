"""The GPU check's report: facts, test outcomes and the benchmark table in one Markdown page.

`python report.py OUT` reads what scripts/gpu_check.sh left in OUT (facts.json,
gpu_tests.xml, gpu_benchmark.md, phases.tsv) and writes OUT/gpu_report.md; it prints the page
and exits non-zero when a CUDA test failed or errored, or a phase did not finish.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path


def test_outcomes(junit: Path) -> list[tuple[str, str, str]]:
    """(test id, outcome, first line of its message) for every test case in a JUnit file."""
    if not junit.exists():
        return []
    outcomes = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or child.text or "").strip().splitlines()
                message = message[0][:200] if message else ""
                break
        outcomes.append((name, outcome, message))
    return outcomes


def facts_section(facts: dict) -> list[str]:
    lines = ["## Machine and versions", ""]
    gpu = facts.get("device_name") or "no CUDA device"
    lines.append(
        f"- GPU: {gpu} (capability {facts.get('capability', '-')}, "
        f"{facts.get('memory_gib', '-')} GiB); nvidia-smi: {facts.get('nvidia_smi')}"
    )
    lines.append(
        f"- python {facts['python']} ({facts['platform']}, {facts['cpus']} CPUs), torch "
        f"{facts['torch']} (CUDA {facts['torch_cuda']}), cuda available: "
        f"{facts['cuda_available']}"
    )
    lines.append("- " + ", ".join(f"{k} {v}" for k, v in facts["versions"].items()))
    lines += [f"- import {name}: {result}" for name, result in facts["imports"].items()]
    unmet = facts["unmet_requirements"]
    lines.append(f"- requirements of the carried wheels: {'; '.join(unmet) or 'all met'}")
    return [*lines, ""]


def tests_section(outcomes: list[tuple[str, str, str]]) -> list[str]:
    counts = Counter(outcome for _, outcome, _ in outcomes)
    summary = ", ".join(f"{counts[k]} {k}" for k in ("passed", "skipped", "failed", "error"))
    lines = ["## CUDA tests (pytest -m gpu)", "", f"{len(outcomes)} collected: {summary}", ""]
    lines += ["| test | outcome | message |", "| --- | --- | --- |"]
    lines += [f"| `{name}` | {outcome} | {message} |" for name, outcome, message in outcomes]
    return [*lines, ""]


def main(out: Path) -> int:
    facts = json.loads((out / "facts.json").read_text())
    outcomes = test_outcomes(out / "gpu_tests.xml")
    phases = [line.split("\t") for line in (out / "phases.tsv").read_text().splitlines()]
    benchmark = out / "gpu_benchmark.md"
    lines = ["# rlcollect GPU check", "", *facts_section(facts), *tests_section(outcomes)]
    lines += ["## Benchmark", ""]
    if benchmark.exists():  # the benchmark's own page, less its title
        lines += [
            line for line in benchmark.read_text().strip().splitlines() if not line.startswith("# ")
        ]
    else:
        lines.append("(no benchmark table)")
    lines.append("")
    lines += ["## Phases", "", "| phase | exit code | seconds |", "| --- | --- | --- |"]
    lines += [f"| {name} | {code} | {seconds} |" for name, code, seconds in phases]
    page = "\n".join(lines) + "\n"
    (out / "gpu_report.md").write_text(page)
    sys.stdout.write(page)
    broken = [name for name, code, _ in phases if code != "0"]
    bad_tests = [name for name, outcome, _ in outcomes if outcome in ("failed", "error")]
    return 1 if broken or bad_tests or not outcomes else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))

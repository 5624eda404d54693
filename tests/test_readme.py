"""The README's front page: the two commands for a fresh machine, and a quickstart that runs as
written. The rest of the documentation lives in docs/ (tests/test_docs.py)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def section_code(heading: str = "## Quickstart") -> str:
    text = README.read_text()
    section = text.split(heading, 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, f"README has no python block under {heading!r}"
    return match.group(1)


def quickstart_code() -> str:
    return section_code()


def test_quickstart_is_short() -> None:
    assert len(quickstart_code().strip().splitlines()) <= 18


def test_quickstart_runs() -> None:
    namespace: dict[str, object] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # e.g. an action that misfits the spec
        exec(compile(quickstart_code(), str(README), "exec"), namespace)
    data = namespace["data"]
    assert data.batch_size == (4, 250)  # type: ignore[attr-defined]
    assert data.names == [None, "time"]  # type: ignore[attr-defined]
    assert len(namespace["buffer"]) == 5000  # type: ignore[arg-type]
    assert namespace["sample"].batch_size == (256,)  # type: ignore[attr-defined]


def test_first_screen_has_the_two_commands_for_a_fresh_machine() -> None:
    first_screen = README.read_text().split("## Quickstart", 1)[0]
    commands = re.search(r"```bash\n(.*?)```", first_screen, re.DOTALL)
    assert commands, "README's first screen has no bash block"
    lines = commands.group(1).strip().splitlines()
    assert [line.split("#", 1)[0].strip() for line in lines] == [
        "bash scripts/rlc.sh train",
        "bash scripts/rlc.sh test",
    ]
    torch_spec = re.search(
        r"TORCH_SPEC:-(\S+?)\}", (README.parent / "scripts" / "rlc.sh").read_text()
    )
    assert torch_spec, "scripts/rlc.sh has no default TORCH_SPEC"
    assert f"`{torch_spec.group(1)}` CPU is installed first" in first_screen

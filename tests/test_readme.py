"""The README's quickstart runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def quickstart_code() -> str:
    text = README.read_text()
    section = text.split("## Quickstart", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "README has no python block under '## Quickstart'"
    return match.group(1)


def test_quickstart_is_short() -> None:
    assert len(quickstart_code().strip().splitlines()) <= 18


def test_quickstart_runs(capsys: object) -> None:
    namespace: dict[str, object] = {}
    exec(compile(quickstart_code(), str(README), "exec"), namespace)
    data = namespace["data"]
    assert data.batch_size == (4, 250)  # type: ignore[attr-defined]
    assert data.names == [None, "time"]  # type: ignore[attr-defined]
    assert len(namespace["buffer"]) == 5000  # type: ignore[arg-type]
    assert namespace["sample"].batch_size == (256,)  # type: ignore[attr-defined]

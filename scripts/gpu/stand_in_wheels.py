"""Empty wheels standing in for the GPU machine's own packages in the offline resolver check.

`python stand_in_wheels.py REQUIREMENTS DIR` writes one `name-version-py3-none-any.whl` per
`name==version` line: metadata only, so pip's resolver sees the machine's torch, numpy, ... at
their versions without a byte of them being downloaded or carried.
"""

from __future__ import annotations

import base64
import hashlib
import re
import sys
import zipfile
from pathlib import Path


def record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def write_stand_in(name: str, version: str, folder: Path) -> Path:
    """A wheel holding only `name`'s metadata at `version`."""
    stem = f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}"
    info = f"{stem}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: stand_in_wheels\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    path = folder / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        lines = []
        for member, text in files.items():
            wheel.writestr(member, text)
            lines.append(record_line(member, text.encode()))
        lines.append(f"{info}/RECORD,,")
        wheel.writestr(f"{info}/RECORD", "\n".join(lines) + "\n")
    return path


def main(requirements: Path, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for line in requirements.read_text().splitlines():
        name, _, version = line.strip().partition("==")
        if not version:
            raise SystemExit(f"stand_in_wheels: {line!r} is not a name==version line")
        write_stand_in(name, version, folder)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

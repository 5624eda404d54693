"""Judge pip's offline dry-run report against the carried wheel folder.

`python check_resolution.py REPORT.json WHEEL_DIR PROVIDED.txt`: every package pip chose must be
a carried wheel or one the GPU machine provides (a stand-in), and every carried wheel must be
chosen: the folder holds exactly what the machine needs, nothing more, nothing less.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def carried_names(folder: Path) -> dict[str, str]:
    """Canonical project name -> wheel file name, for every wheel in `folder`."""
    return {canonical(wheel.name.split("-")[0]): wheel.name for wheel in folder.glob("*.whl")}


def main(report_path: Path, folder: Path, provided_path: Path) -> None:
    report = json.loads(report_path.read_text())
    chosen = {
        canonical(item["metadata"]["name"]): item["metadata"]["version"]
        for item in report["install"]
    }
    provided = {
        canonical(line.partition("==")[0]) for line in provided_path.read_text().splitlines()
    }
    carried = carried_names(folder)
    known = set(carried) | provided
    problems = [f"{name} is neither carried nor provided" for name in chosen if name not in known]
    problems += [
        f"{wheel} is carried but nothing needs it"
        for name, wheel in carried.items()
        if name not in chosen
    ]
    if problems:
        raise SystemExit("check_resolution: " + "; ".join(problems))
    used = sorted(name for name in chosen if name in provided)
    print(
        f"check_resolution: resolved offline: {len(carried)} carried wheels, "
        f"{len(used)} of the machine's packages ({', '.join(used)})"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))

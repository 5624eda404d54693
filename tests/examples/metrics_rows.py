"""An example run's metrics.csv rows (`metrics`), and the rows without the clock's columns."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

# What changes from run to run of the same seed: the clock (and the end-of-run evaluation).
CLOCK_COLUMNS = {"wall_time_s", "frames_per_second", "weight_update_s", "final_eval_return"}


def metrics(run_dir: Path) -> list[dict[str, float]]:
    with (run_dir / "metrics.csv").open(newline="") as file:
        return [
            {name: float(value) if value else math.nan for name, value in row.items()}
            for row in csv.DictReader(file)
        ]


def without_clock(rows: list[dict[str, float]]) -> list[dict[str, Any]]:
    """The rows with NaN made comparable and the wall-clock columns dropped."""
    return [
        {n: ("nan" if math.isnan(v) else v) for n, v in row.items() if n not in CLOCK_COLUMNS}
        for row in rows
    ]

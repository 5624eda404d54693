"""`MetricsLog`: a run's metrics as rows of `metrics.csv`, and the return-against-frames plot."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

FRAMES = "frames"
MEAN_RETURN = "mean_episode_return"
WINDOW_RETURN = "mean_return_last_100"
EVAL_RETURN = "eval_return"
FINAL_EVAL_RETURN = "final_eval_return"
EPISODE_LENGTH = "mean_episode_length"
BASE_COLUMNS = (
    FRAMES,
    "wall_time_s",
    "frames_per_second",
    "episodes",
    MEAN_RETURN,
    WINDOW_RETURN,
    EPISODE_LENGTH,
)


class MetricsLog:
    """Appends one row per logging step to a CSV file, flushed at once.

    A file that already exists (a resumed run writing to the same run dir) is appended to with
    its own header, after dropping its rows past `keep_through_frames` (those the interrupted
    run logged after the checkpoint it resumes from, and will log again); otherwise a new file
    is started with `BASE_COLUMNS` and `extra_columns`.

    Examples:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "metrics.csv"
        >>> log = MetricsLog(path, extra_columns=["loss"])
        >>> log.write({"frames": 100, "mean_episode_return": 9.5, "loss": 0.25})
        >>> log.close()
        >>> read_metrics(path)[0]["loss"]
        0.25
    """

    def __init__(
        self,
        path: Path,
        extra_columns: Sequence[str] = (),
        *,
        append: bool = False,
        keep_through_frames: int | None = None,
    ):
        self.path = Path(path)
        columns = [*BASE_COLUMNS, *(c for c in extra_columns if c not in BASE_COLUMNS)]
        if append and self.path.is_file() and self.path.stat().st_size:
            with self.path.open(newline="") as existing:
                reader = csv.reader(existing)
                columns = next(reader)
                rows = list(reader)
            if keep_through_frames is not None and FRAMES in columns:
                index = columns.index(FRAMES)
                kept = [row for row in rows if float(row[index]) <= keep_through_frames]
                if len(kept) != len(rows):
                    with self.path.open("w", newline="") as rewritten:
                        csv.writer(rewritten).writerows([columns, *kept])
            self._file = self.path.open("a", newline="")
            self._writer = csv.DictWriter(self._file, columns, extrasaction="ignore")
        else:
            self._file = self.path.open("w", newline="")
            self._writer = csv.DictWriter(self._file, columns, extrasaction="ignore")
            self._writer.writeheader()
        self.columns = columns

    def write(self, row: Mapping[str, float | int]) -> None:
        """Write one row (missing columns are left empty) and flush it to disk."""
        self._writer.writerow({key: _cell(value) for key, value in row.items()})
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()


def _cell(value: float | int) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return str(value)


def read_metrics(path: Path) -> list[dict[str, float]]:
    """The rows of a metrics CSV as floats (empty cells become NaN)."""
    with Path(path).open(newline="") as file:
        return [
            {key: float(value) if value else math.nan for key, value in row.items()}
            for row in csv.DictReader(file)
        ]


def set_in_last_row(csv_path: Path, column: str, value: float) -> None:
    """Write `value` under `column` in the last row of `csv_path`, adding the column if the
    file lacks it (e.g. the greedy evaluation a run ends with)."""
    with csv_path.open(newline="") as file:
        reader = csv.DictReader(file)
        columns = list(reader.fieldnames or [])
        rows = list(reader)
    if not rows:
        return
    if column not in columns:
        columns.append(column)
    rows[-1][column] = _cell(value)
    with csv_path.open("w", newline="") as file:
        writer = csv.DictWriter(file, columns)
        writer.writeheader()
        writer.writerows(rows)


def plot_returns(csv_path: Path, png_path: Path, title: str = "") -> None:
    """Save a plot of mean episode return against frames from the rows of `csv_path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    all_rows = read_metrics(csv_path)
    figure, axes = plt.subplots(figsize=(6, 4))
    curves = (
        (MEAN_RETURN, "training episodes (last batch)"),
        (WINDOW_RETURN, "training episodes (last 100)"),
        (EVAL_RETURN, "greedy evaluation"),
        (FINAL_EVAL_RETURN, "final greedy evaluation"),
    )
    for column, label in curves:
        rows = [row for row in all_rows if not math.isnan(row.get(column, math.nan))]
        if rows:
            points = [row[FRAMES] for row in rows], [row[column] for row in rows]
            axes.plot(*points, marker=".", label=label)
    if axes.get_legend_handles_labels()[0]:
        axes.legend()
    axes.set_xlabel("frames")
    axes.set_ylabel("mean episode return")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(png_path, dpi=100)
    plt.close(figure)

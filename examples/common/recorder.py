"""`RunRecorder`: progress bar, metrics CSV, return plot and checkpoint schedule of one run."""

from __future__ import annotations

import atexit
import math
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .checkpoint import CHECKPOINT_NAME, save_checkpoint
from .loggers import ExperimentLogger, finite_scalars
from .metrics import (
    EPISODE_LENGTH,
    FINAL_EVAL_RETURN,
    FRAMES,
    MEAN_RETURN,
    MetricsLog,
    plot_returns,
    set_in_last_row,
)

METRICS_NAME = "metrics.csv"
PLOT_NAME = "return.png"
CONFIG_NAME = "config.yaml"
WEIGHT_UPDATE = "weight_update_s"  # seconds of the last update_policy_weights_()


class RunRecorder:
    """Everything a run leaves behind, in `run_dir`: `metrics.csv`, `return.png`, and
    `checkpoint.pt` (written every `checkpoint_every` frames and at the end); each metrics
    row also goes to the run's experiment logger (TensorBoard, W&B, MLflow), at its frames.

    Args:
        run_dir: the run directory (Hydra's output dir).
        total_frames: the frames of the whole run (-1: endless), for the progress bar.
        start_frames: the frames already collected (by the run this one resumes).

    Keyword Args:
        extra_columns: the script's own metric columns.
        checkpoint_every: frames between checkpoints (0: only at the end).
        title: the plot's title.
        resumed: append to an existing `metrics.csv` instead of starting a new one.
        previous_run: the run dir of the checkpoint this run resumes; a new run dir starts
            with its metrics rows.
        elapsed: wall-clock seconds spent by the runs this one resumes.
        logger: the experiment logger that gets each row's scalars (default: none but the CSV).

    Examples:
        >>> import tempfile
        >>> recorder = RunRecorder(Path(tempfile.mkdtemp()), 100, 0, progress=False)
        >>> recorder.log({"frames": 50, "mean_episode_return": 12.0})
        >>> recorder.close()
        >>> sorted(path.name for path in recorder.run_dir.iterdir())
        ['metrics.csv', 'return.png']
    """

    def __init__(
        self,
        run_dir: Path,
        total_frames: int,
        start_frames: int,
        *,
        extra_columns: Sequence[str] = (),
        checkpoint_every: int = 0,
        title: str = "",
        resumed: bool = False,
        elapsed: float = 0.0,
        progress: bool = True,
        previous_run: Path | None = None,
        logger: ExperimentLogger | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.logger = logger if logger is not None else ExperimentLogger()
        self._timings: dict[str, float] = {}
        # Frames and episodes at the last row (episodes unknown at the start of a resumed run).
        self._last_count: tuple[int, float] = (start_frames, math.nan if resumed else 0)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resumed and previous_run is not None:
            self._carry_metrics_over(Path(previous_run))
        self.metrics = MetricsLog(
            self.run_dir / METRICS_NAME,
            extra_columns,
            append=resumed,
            keep_through_frames=start_frames if resumed else None,
        )
        self.checkpoint_path = self.run_dir / CHECKPOINT_NAME
        self.checkpoint_every = checkpoint_every
        self.title = title
        self._next_checkpoint = self._after(start_frames)
        self._clock_start = time.perf_counter() - elapsed
        self._bar_frames = start_frames
        self.last_row: dict[str, Any] = {}
        self.bar = tqdm(
            total=total_frames if total_frames > 0 else None,
            initial=start_frames,
            unit="frame",
            unit_scale=True,
            dynamic_ncols=True,
            mininterval=1.0,
            disable=not progress,
        )

    @classmethod
    def for_run(
        cls,
        cfg: Any,
        collector: Any,
        state: Mapping[str, Any],
        title: str,
        extra_columns: Sequence[str] = (),
    ) -> RunRecorder:
        """The recorder of an example's run: in Hydra's output dir, counting the collector's
        frames, carrying a resumed run's metrics and elapsed time over (`state` is the
        checkpoint resumed from, empty for a fresh run), with the experiment logger of
        `cfg.logger`. The resolved config is saved as `config.yaml` in the run dir (Hydra's
        `.hydra/config.yaml` keeps the interpolations) and handed to the logger."""
        from hydra.core.hydra_config import HydraConfig
        from omegaconf import OmegaConf

        from .config import build, resume_path

        previous = resume_path(cfg) if state else None
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, run_dir / CONFIG_NAME, resolve=True)
        logger = build(cfg, "logger", run_dir=run_dir) if "logger" in cfg else None
        if logger is not None:
            # A run that fails still flushes its events and ends its tracker run.
            atexit.register(logger.close)
            logger.log_config(OmegaConf.to_container(cfg, resolve=True))
        return cls(
            run_dir,
            collector.total_frames,
            collector.frames,
            extra_columns=extra_columns,
            checkpoint_every=cfg.checkpoint_every,
            title=title,
            resumed=bool(state),
            previous_run=previous.parent if previous is not None else None,
            elapsed=float(state.get("elapsed", 0.0)),
            progress=cfg.progress,
            logger=logger,
        )

    def _carry_metrics_over(self, previous_run: Path) -> None:
        """Start this run's `metrics.csv` with the rows of the run it resumes (those past its
        checkpoint are dropped by `MetricsLog`), so that one file and one plot tell the
        whole run."""
        source, target = previous_run / METRICS_NAME, self.run_dir / METRICS_NAME
        if source.is_file() and not target.exists() and source.resolve() != target.resolve():
            shutil.copyfile(source, target)

    def _after(self, frames: int) -> float:
        if self.checkpoint_every <= 0:
            return math.inf
        return (frames // self.checkpoint_every + 1) * self.checkpoint_every

    @property
    def frames(self) -> int:
        """The frames of the run so far (those of the runs it resumes included)."""
        return self._bar_frames

    @property
    def elapsed(self) -> float:
        """Wall-clock seconds of the run, those of the runs it resumes included."""
        return time.perf_counter() - self._clock_start

    def log(self, stats: Mapping[str, Any], **extra: float) -> None:
        """Advance the bar to `stats["frames"]` and write a metrics row (`stats` + `extra`, the
        timings of `timed` blocks since the last row, the episode length) to the CSV, and its
        finite scalars to the experiment logger."""
        frames = int(stats["frames"])
        row = {
            **stats,
            "wall_time_s": self.elapsed,
            EPISODE_LENGTH: self._episode_length(frames, stats),
            **self._timings,
            **self._collector_timings(stats),
            **extra,
        }
        self._timings = {}
        self.metrics.write(row)
        logged = {name: row[name] for name in self.metrics.columns if name in row}
        logged.pop(FRAMES, None)
        self.logger.log_metrics(finite_scalars(logged), frames)
        self.last_row = row
        self.bar.set_postfix({"return": f"{row.get(MEAN_RETURN, math.nan):.1f}"}, refresh=False)
        self.bar.update(frames - self._bar_frames)
        self._bar_frames = frames

    def _episode_length(self, frames: int, stats: Mapping[str, Any]) -> float:
        """The collector's mean length of its last 100 finished episodes; for a collector
        whose stats have none (a multi-agent one), frames per episode finished since the last
        row, the mean length in steady state. NaN when none finished."""
        episodes = float(stats.get("episodes", math.nan))
        last_frames, last_episodes = self._last_count
        self._last_count = (frames, episodes)
        if "mean_length_last_100" in stats:
            return float(stats["mean_length_last_100"])
        finished = episodes - last_episodes
        return (frames - last_frames) / finished if finished > 0 else math.nan

    @staticmethod
    def _collector_timings(stats: Mapping[str, Any]) -> dict[str, float]:
        """The seconds of the collector's last weight update, from its stats, once it made one
        (a `timed(WEIGHT_UPDATE)` block of the script says the same from outside)."""
        seconds = float(stats.get("weight_update_seconds", math.nan))
        return {WEIGHT_UPDATE: seconds} if math.isfinite(seconds) else {}

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Time the block; its seconds go in the next row under `name` (e.g. the weight
        update: `with recorder.timed(WEIGHT_UPDATE): collector.update_policy_weights_()`)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._timings[name] = time.perf_counter() - start

    def checkpoint_due(self, frames: int) -> bool:
        """Whether `frames` passed the next checkpoint interval."""
        return frames >= self._next_checkpoint

    def save(self, frames: int, state: Callable[[], dict[str, Any]]) -> None:
        """Write `state()` (with the run's elapsed time) as the checkpoint, and the plot."""
        save_checkpoint(self.checkpoint_path, {**state(), "elapsed": self.elapsed})
        self._next_checkpoint = self._after(frames)
        self.plot()

    def plot(self) -> None:
        """Redraw `return.png` from `metrics.csv`."""
        plot_returns(self.metrics.path, self.run_dir / PLOT_NAME, self.title)

    def record_final_evaluation(self, mean_return: float) -> None:
        """Add the greedy evaluation a run ends with to its last metrics row (column
        `final_eval_return`) and to the plot."""
        set_in_last_row(self.metrics.path, FINAL_EVAL_RETURN, mean_return)
        self.logger.log_metrics(finite_scalars({FINAL_EVAL_RETURN: mean_return}), self.frames)
        self.plot()

    def close(self) -> None:
        """Close the bar and the CSV file and draw the final plot (the experiment logger stays
        open for the final evaluation and its video: `finish()` closes it)."""
        self.bar.close()
        self.metrics.close()
        self.plot()

    def finish(self) -> None:
        """Close the experiment logger: the end of the run."""
        self.logger.close()
        atexit.unregister(self.logger.close)

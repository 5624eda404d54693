"""Experiment loggers of the examples (the `logger=` config group): TensorBoard, W&B, MLflow.

Every run writes `metrics.csv` (the `csv` logger adds nothing to it); the others send the same
scalars, indexed by frames, and the evaluation videos to their library through its own API.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

VIDEO_TAG = "eval/video"


class ExperimentLogger:
    """What a run tells an experiment tracker: scalars at a frame count, the resolved config
    once, and the videos of its greedy evaluations. The base class records nothing: the
    run's `metrics.csv` (written by `RunRecorder` in every case) is all there is.

    Examples:
        >>> logger = ExperimentLogger()
        >>> logger.log_metrics({"loss": 0.5}, step=100)
        >>> logger.close()
    """

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Record the run's resolved config (a nested dict)."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Record scalars (finite floats only) at `step` frames."""

    def log_video(self, path: Path, step: int) -> None:
        """Record the video file at `path` (an mp4 of a greedy episode) at `step` frames."""

    def close(self) -> None:
        """Flush and release what the logger holds; idempotent."""


class CsvLogger(ExperimentLogger):
    """The `csv` logger (the default): `metrics.csv` and `return.png` in the run dir, which
    every run writes anyway; nothing more."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)


def finite_scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The entries of `row` that are finite numbers (bools, NaN and non-numbers dropped):
    what a tracker can plot."""
    scalars = {}
    for name, value in row.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            scalars[name] = float(value)
    return scalars


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`: the flat parameters MLflow takes."""
    flat: dict[str, Any] = {}
    for name, value in config.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{key}."))
        else:
            flat[key] = value
    return flat


class TensorBoardLogger(ExperimentLogger):
    """TensorBoard event files in `<run dir>/<subdir>` through torch's `SummaryWriter`.

    Videos go in as animated GIF images (TensorBoard has no video type; it shows a GIF image
    as an animation, as `SummaryWriter.add_video` does, which needs moviepy 1's
    `moviepy.editor` and writes an empty image with moviepy 2).
    """

    def __init__(self, run_dir: Path, subdir: str = "tensorboard") -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / subdir))

    def log_config(self, config: Mapping[str, Any]) -> None:
        import yaml

        self.writer.add_text("config", f"```\n{yaml.safe_dump(dict(config))}```")

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=step)

    def log_video(self, path: Path, step: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        frames, fps = read_video(path)
        height, width, channels = frames[0].shape
        image = Summary.Image(
            height=height,
            width=width,
            colorspace=channels,
            encoded_image_string=gif_bytes(frames, fps),
        )
        summary = Summary(value=[Summary.Value(tag=VIDEO_TAG, image=image)])
        self.writer.file_writer.add_summary(summary, step)

    def close(self) -> None:
        self.writer.close()


class WandbLogger(ExperimentLogger):
    """A W&B run in `<run dir>/wandb` (`mode="offline"` by default: nothing leaves the
    machine; `wandb sync` uploads it later). `WANDB_MODE` in the environment wins."""

    def __init__(
        self,
        run_dir: Path,
        project: str = "rlcollect",
        mode: str = "offline",
        name: str | None = None,
        **init_options: Any,
    ) -> None:
        import wandb

        self._wandb = wandb
        self.run = wandb.init(
            project=project,
            dir=str(run_dir),
            mode=os.environ.get("WANDB_MODE", mode),  # type: ignore[arg-type]
            name=name or Path(run_dir).name,
            **init_options,
        )

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def log_video(self, path: Path, step: int) -> None:
        self.run.log({VIDEO_TAG: self._wandb.Video(str(path), format="mp4")}, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowLogger(ExperimentLogger):
    """An MLflow run; by default in a local file store, `<run dir>/mlruns` (MLflow 3 keeps
    the file store in maintenance mode and asks for `MLFLOW_ALLOW_FILE_STORE=true`, set here
    unless the environment says otherwise). Videos are the run's artifacts under `videos/`."""

    def __init__(
        self,
        run_dir: Path,
        experiment: str = "rlcollect",
        tracking_uri: str | None = None,
        name: str | None = None,
    ) -> None:
        import mlflow

        self._mlflow = mlflow
        if tracking_uri is None:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            tracking_uri = (Path(run_dir).resolve() / "mlruns").as_uri()
        mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_experiment(experiment)
        self.run = mlflow.start_run(run_name=name or Path(run_dir).name)
        self._open = True

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._mlflow.log_params(flatten(config))

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self._mlflow.log_metrics(dict(metrics), step=step)

    def log_video(self, path: Path, step: int) -> None:
        self._mlflow.log_artifact(str(path), artifact_path="videos")

    def close(self) -> None:
        if self._open:
            self._mlflow.end_run()
            self._open = False


def read_video(path: Path) -> tuple[list[Any], float]:
    """The frames (`[H, W, 3]` uint8 arrays) and frame rate of a video file."""
    from moviepy import VideoFileClip

    clip = VideoFileClip(str(path), audio=False)
    try:
        return list(clip.iter_frames()), float(clip.fps)
    finally:
        clip.close()


def gif_bytes(frames: list[Any], fps: float) -> bytes:
    """`frames` as an endlessly looping animated GIF, encoded by Pillow."""
    import io

    from PIL import Image

    images = [Image.fromarray(frame) for frame in frames]
    output = io.BytesIO()
    images[0].save(
        output,
        format="GIF",
        save_all=True,
        append_images=images[1:],
        duration=max(1, round(1000 / fps)),
        loop=0,
    )
    return output.getvalue()

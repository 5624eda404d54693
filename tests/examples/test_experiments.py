"""What every example run gives a user: experiment loggers (TensorBoard, W&B, MLflow), videos
of the greedy policy, repeatable seeds, the resolved config, and a clean Ctrl-C."""

from __future__ import annotations

import io
import os
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.examples.metrics_rows import metrics, without_clock
from tests.examples.script_runner import (
    EXAMPLES,
    REPO_ROOT,
    check_run_outputs,
    check_succeeded,
    checkpoint_frames,
    run_script,
)

# A constant learning rate and clip range: a run cut short by Ctrl-C then trains as a short
# run of the same seed does, row for row.
TINY = (
    "env.num_envs=4",
    "collector.frames_per_batch=256",
    "progress=false",
    "seed=7",
    "ppo.anneal_lr=false",
    "ppo.anneal_clip=false",
)


def wandb_history(run_file: Path) -> dict[int, dict[str, Any]]:
    """The history rows of a W&B run file (`run-<id>.wandb`) by step, read with W&B's own
    record type. The file is a LevelDB-style log: a 7-byte W&B header, then 32 KiB blocks
    of chunks (crc32, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data, block, position = run_file.read_bytes(), 32768, 7
    assert data[:4] == b":W&B", "a W&B run file"
    rows: dict[int, dict[str, Any]] = {}
    pending = b""
    while position + 7 <= len(data):
        room = block - position % block
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if room < 7 or (length == 0 and kind == 0):
            position += room  # the rest of the block is padding
            continue
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                items = {"/".join(item.nested_key): item.value_json for item in record.history.item}
                rows[record.history.step.num] = items
    return rows


@pytest.fixture(scope="module")
def tensorboard_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A short PPO run logging to TensorBoard, with a video after its first iteration and at
    the end: its run dir and console output."""
    run_dir = tmp_path_factory.mktemp("tensorboard") / "run"
    settings = ("collector.total_frames=512", "eval_episodes=1")
    videos = ("video.enabled=true", "video.every=1")
    result = run_script("ppo", run_dir, *TINY, *settings, "logger=tensorboard", *videos)
    check_succeeded(result)
    return run_dir, result.stdout


# The tests that read tensorboard_run (a PPO run) share one pytest-xdist worker, so that the
# run is made once.
@pytest.mark.xdist_group("tensorboard_run")
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tensorboard_logger_and_videos(tensorboard_run: tuple[Path, str]) -> None:
    import imageio.v3 as iio
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, output = tensorboard_run
    check_run_outputs(run_dir)
    rows = metrics(run_dir)
    assert [row["frames"] for row in rows] == [256, 512]

    # --- the resolved config beside the outputs, and Hydra's own copy ---
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["seed"] == 7
    assert saved["env"]["make"]["num_workers"] == 4, "interpolations resolved"
    assert saved["logger"]["_target_"] == "common.loggers.TensorBoardLogger"
    assert yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())["seed"] == 7

    # --- the scalars, read back by TensorBoard's own reader, are the CSV's, at its frames ---
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    for tag in (
        "frames_per_second",
        "mean_episode_return",
        "mean_episode_length",
        "loss_policy",
        "loss_value",
        "lr",
        "weight_update_s",
    ):
        scalars = events.Scalars(tag)
        assert [s.step for s in scalars] == [int(row["frames"]) for row in rows], tag
        assert [s.value for s in scalars] == pytest.approx([row[tag] for row in rows], rel=1e-4)
    assert rows[-1]["weight_update_s"] > 0
    (final,) = events.Scalars("final_eval_return")
    assert (final.step, final.value) == (512, pytest.approx(rows[-1]["final_eval_return"]))
    assert "config/text_summary" in events.Tags()["tensors"], "the resolved config as text"

    # --- videos after iteration 1 and at the end: mp4 files of n steps + 1 frames ---
    recorded = dict(re.findall(r"video (\S+\.mp4): a greedy episode of (\d+) steps", output))
    videos = sorted((run_dir / "videos").glob("*.mp4"))
    assert [path.name for path in videos] == ["eval-256-episode-0.mp4", "final-512-episode-0.mp4"]
    for path in videos:
        frames = iio.imread(path, plugin="FFMPEG")
        steps = int(recorded[str(path)])
        assert frames.shape == (steps + 1, 400, 600, 3), "CartPole's 600x400 frames, reset + steps"
        assert frames.std() > 0, "a picture, not a blank"
    # ... and in TensorBoard as animated images of the same frames, at the same frame counts.
    images = events.Images("eval/video")
    assert [image.step for image in images] == [256, 512]
    gif = Image.open(io.BytesIO(images[-1].encoded_image_string))
    assert gif.format == "GIF"
    assert gif.n_frames == int(recorded[str(videos[-1])]) + 1


@pytest.mark.xdist_group("tensorboard_run")
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("no_leftover_children")
def test_ctrl_c_ends_a_wandb_run_saved_and_the_same_seed_trains_the_same(
    tensorboard_run: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    monkeypatch.setenv("WANDB_MODE", "offline")  # nothing goes online
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb_home"))
    command = [
        sys.executable,
        str(EXAMPLES / "ppo.py"),
        f"hydra.run.dir={run_dir}",
        *TINY,
        "collector.total_frames=100000000",
        "logger=wandb",
    ]
    log_path = tmp_path / "output.txt"
    with log_path.open("w") as output:
        process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        try:
            # Ctrl-C once training is under way (two metrics rows written), with the
            # process's children (W&B's service) running.
            while process.poll() is None and len(_lines(run_dir / "metrics.csv")) < 3:
                time.sleep(0.1)
            assert process.poll() is None, log_path.read_text()
            children = descendants(process.pid)
            process.send_signal(signal.SIGINT)
            returncode = process.wait(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()

    # --- the run ended at once, checkpoint and metrics written, no process left ---
    text = log_path.read_text()
    assert returncode == 130, text
    assert "Traceback" not in text
    assert f"interrupted: the checkpoint and metrics are in {run_dir}" in text
    rows = metrics(run_dir)
    assert checkpoint_frames(run_dir) == int(rows[-1]["frames"]) >= 512
    assert (run_dir / "return.png").is_file()
    assert "greedy evaluation" not in text, "an interrupted run skips the evaluation"
    assert children, "W&B's service process ran beside the script"
    assert not [pid for pid in children if _alive(pid)], "no process of the run is left"

    # --- seed=: its first rows are the short run's of the same seed (which another logger
    # and videos recorded during training did not disturb) ---
    short_run, _ = tensorboard_run
    assert without_clock(rows[:2]) == without_clock(metrics(short_run))

    # --- W&B: an offline run in <run dir>/wandb, its history at the CSV's frames, finished ---
    (run_file,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    history = wandb_history(run_file)
    for row in rows:
        logged = history[int(row["frames"])]
        for tag in ("mean_episode_return", "loss_value", "lr", "frames_per_second"):
            assert float(logged[tag]) == pytest.approx(row[tag], rel=1e-4), tag


@pytest.mark.parametrize(
    ("script", "overrides", "message"),
    [
        ("ppo", ["video.enabled=yes"], r"^video.enabled='yes': expected true or false"),
        ("ppo", ["video.every=-1"], r"^video.every=-1: expected an int >= 0"),
        ("dqn", ["video.max_steps=0"], r"^video.max_steps=0: expected a positive int"),
        ("dqn", ["dqn.background=maybe"], r"^dqn.background='maybe': expected true or false"),
        (
            "ppo",
            ["env=cartpole_vector", "video.enabled=true"],
            r"^video.enabled=true: videos are recorded from a Gymnasium env, but env.make "
            r"\(rlcollect.envs.GymVectorEnv\) is neither",
        ),
        ("ppo", ["~logger._target_"], r"^logger: expected a config node with a _target_"),
        (
            "dqn",
            ["logger=tensorboard", "+logger.sub_dir=x"],
            r"^logger.sub_dir: common.loggers.TensorBoardLogger takes no argument 'sub_dir'. "
            r"Did you mean logger.subdir\?",
        ),
    ],
)
def test_logger_and_video_config_errors_name_the_key_before_any_work(
    scripts: dict[str, ModuleType], script: str, overrides: list[str], message: str
) -> None:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(EXAMPLES / "conf"), version_base=None):
        cfg = compose(config_name=script, overrides=overrides)
    with pytest.raises(scripts[script].ConfigError, match=message):
        scripts[script].check_config(cfg)


def test_mlflow_logger_keeps_the_rows_a_run_records(
    scripts: dict[str, ModuleType], tmp_path: Path
) -> None:
    from common.loggers import MlflowLogger
    from common.recorder import RunRecorder
    from mlflow.tracking import MlflowClient

    logger = MlflowLogger(tmp_path, experiment="test")
    logger.log_config({"seed": 7, "optim": {"lr": 0.003}})
    recorder = RunRecorder(tmp_path, 200, 0, extra_columns=["loss"], progress=False, logger=logger)
    recorder.log({"frames": 100, "episodes": 4, "mean_episode_return": 9.5}, loss=0.25)
    recorder.log({"frames": 200, "episodes": 6, "mean_episode_return": float("nan")}, loss=0.5)
    recorder.close()
    recorder.record_final_evaluation(12.0)
    video = tmp_path / "eval-200-episode-0.mp4"
    video.write_bytes(b"not looked into")
    logger.log_video(video, 200)
    recorder.finish()
    recorder.finish()  # idempotent

    # --- a local file store in <run dir>/mlruns, read back by MLflow's client ---
    client = MlflowClient((tmp_path / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("test").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params == {"seed": "7", "optim.lr": "0.003"}
    history = {
        tag: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, tag)]
        for tag in ("loss", "mean_episode_return", "mean_episode_length", "final_eval_return")
    }
    assert history["loss"] == [(100, 0.25), (200, 0.5)]
    assert history["mean_episode_return"] == [(100, 9.5)], "NaN is not sent"
    assert history["mean_episode_length"] == [(100, 25.0), (200, 50.0)], "frames per episode"
    assert history["final_eval_return"] == [(200, 12.0)]
    (artifact,) = client.list_artifacts(run.info.run_id, "videos")
    assert artifact.path == "videos/eval-200-episode-0.mp4"


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


def descendants(pid: int) -> set[int]:
    """The processes under `pid` now (children, their children, ...), from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"

"""Collection only: run any collector on any env from the config and print frames/s.

Run from the repository root:

    python examples/collect.py                                  # CartPole-v1, 8 envs
    python examples/collect.py env=catch_batched policy=null    # pixels, random actions
    python examples/collect.py collector.total_frames=1000000 collector.frames_per_batch=4096

The run directory receives metrics.csv, return.png and checkpoint.pt (collector and policy).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import hydra
import torch
from common.config import (
    build,
    build_partial,
    check_overrides,
    checkpoint_identity,
    resume_state,
    run_or_exit,
    validate,
)
from common.env_info import probe_env
from common.extras import check_extras
from common.interrupt import StopOnInterrupt
from common.recorder import RunRecorder
from omegaconf import DictConfig
from tensordict.nn import TensorDictModule

from rlcollect import keys

log = logging.getLogger(__name__)  # Hydra sends it to the console and the job log


def train(cfg: DictConfig) -> None:
    # --- set-up: everything from the config, checked before any work ---
    targets = ["env.make", "collector", "logger"] + (["policy"] if cfg.policy is not None else [])
    validate(cfg, targets=targets, positive_ints=["torch_threads"])
    state: dict[str, Any] = resume_state(cfg, "collect", ("collector",))
    torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    env_factory = build_partial(cfg, "env.make")
    info = probe_env(env_factory)
    actor = build(cfg, "policy", info=info) if cfg.policy is not None else None
    policy = None
    if actor is not None:
        out_keys = [keys.ACTION, keys.SAMPLE_LOG_PROB]
        policy = TensorDictModule(actor, in_keys=[info.observation_key], out_keys=out_keys)
    collector = build(cfg, "collector", create_env_fn=env_factory, policy=policy)
    collector.set_seed(cfg.seed)

    if state:
        collector.load_state_dict(state["collector"])

    def checkpoint() -> dict[str, Any]:
        return {
            **checkpoint_identity(cfg, "collect"),
            "frames": collector.frames,
            "collector": collector.state_dict(),
        }

    recorder = RunRecorder.for_run(cfg, collector, state, f"collection {cfg.env.id}")

    # --- collect ---
    start_frames, start = collector.frames, time.perf_counter()
    with StopOnInterrupt() as stop:
        for _ in collector:
            recorder.log(collector.stats())
            if recorder.checkpoint_due(collector.frames):
                recorder.save(collector.frames, checkpoint)
            if stop.requested:
                break
    seconds = time.perf_counter() - start
    recorder.save(collector.frames, checkpoint)
    recorder.close()
    collector.shutdown()
    collected = collector.frames - start_frames
    # The run's average over the whole loop (logging and checkpoints included); the progress
    # bar shows tqdm's smoothed rate of the last updates instead, so the two differ.
    log.info(
        f"collected {collected} frames in {seconds:.2f} s: {collected / max(seconds, 1e-9):.0f} "
        f"frames/s (env {cfg.env.id}, batch {tuple(info.batch_size)}, "
        f"policy {type(actor).__name__ if actor is not None else 'random'}); the average over "
        f"the whole run, logging and checkpoints included (the progress bar shows the recent "
        f"rate); run_dir={recorder.run_dir}"
    )
    recorder.finish()
    stop.exit_if_requested(recorder.run_dir)


@hydra.main(config_path="conf", config_name="collect", version_base=None)
def main(cfg: DictConfig) -> None:
    run_or_exit(train, cfg)


if __name__ == "__main__":
    check_overrides("collect", sys.argv[1:])
    check_extras("collect", sys.argv[1:])
    main()

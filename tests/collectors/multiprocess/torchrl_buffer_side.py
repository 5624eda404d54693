"""TorchRL replay buffers filled by multi-process collectors (TorchRL's, run in a Python process
of their own as in `torchrl_side`, and ours), described alike for side-by-side tests."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from tests.collectors.multiprocess.torchrl_side import leaf_keys, run_side, torchrl_cartpole

CAPACITY = 1000


def cartpole_policy() -> Any:
    """A deterministic CartPole policy writing `"logits"` and a one-hot `"action"` (an output
    besides the action, which the buffer must lay out too)."""
    from tensordict.nn import TensorDictModule, TensorDictSequential

    torch.manual_seed(0)
    scores = TensorDictModule(torch.nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"])
    pick = TensorDictModule(OneHotArgmax(), in_keys=["logits"], out_keys=["action"])
    return TensorDictSequential(scores, pick)


class OneHotArgmax(torch.nn.Module):
    """The best of two scores, as a one-hot action."""

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(logits.argmax(-1), 2)


def torchrl_buffer(kind: str, directory: Path) -> Any:
    """A TorchRL buffer: `"tensor"` / `"memmap"` (lazy, not holding data yet),
    `"shared_init"` (lazy, laid out by the workers) or
    `"initialised"` (laid out by hand beforehand, as TorchRL's docs suggest: a zero batch of
    the env's fake TensorDict with the policy's outputs and trajectory ids, written then
    emptied)."""
    from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer

    if kind == "memmap":
        return ReplayBuffer(storage=LazyMemmapStorage(CAPACITY, scratch_dir=directory / kind))
    if kind == "shared_init":  # laid out by the first worker that writes
        return ReplayBuffer(storage=LazyTensorStorage(CAPACITY, shared_init=True))
    buffer = ReplayBuffer(storage=LazyTensorStorage(CAPACITY))
    if kind == "initialised":
        with torch.no_grad():
            zeros = cartpole_policy()(torchrl_cartpole().fake_tensordict())
        zeros["collector", "traj_ids"] = torch.zeros((), dtype=torch.int64)
        buffer.extend(zeros.unsqueeze(-1))
        buffer.empty()
    return buffer


def fill(module: Any, builder: str, kind: str, directory: Path, **options: Any) -> dict[str, Any]:
    """Build `module.builder` (a multi-process collector class) on two CartPole workers with
    the policy and a `kind` buffer, iterate it to the end and describe what it yielded and
    what the buffer holds."""
    buffer = torchrl_buffer(kind, directory)
    collector = getattr(module, builder)(
        [torchrl_cartpole, torchrl_cartpole],
        cartpole_policy(),
        frames_per_batch=40,
        total_frames=120,
        replay_buffer=buffer,
        **options,
    )
    try:
        yielded = [item is None for item in collector]
        frames = getattr(collector, "frames", getattr(collector, "_frames", None))
        pids = collector.process_ids() if hasattr(collector, "process_ids") else []
    finally:
        collector.shutdown()
    return {"yielded_none": yielded, "frames": frames, "pids": pids, **describe_buffer(buffer)}


def describe_buffer(buffer: Any) -> dict[str, Any]:
    """What the tests compare: how many frames the buffer holds, their keys, per-frame shapes
    and dtypes, and whether each trajectory's frames follow one another (the next observation
    of a step that did not end is the observation of the trajectory's next stored step)."""
    stored = buffer[: len(buffer)]
    ids = stored["collector", "traj_ids"]
    breaks = 0
    for trajectory in ids.unique().tolist():
        steps = stored[ids == trajectory]
        follows = steps["next", "observation"][:-1] == steps["observation"][1:]
        ended = steps["next", "done"][:-1].squeeze(-1)
        breaks += int((~follows.all(-1) & ~ended).sum())
    return {
        "len": len(buffer),
        "write_count": buffer.write_count,
        "keys": leaf_keys(stored),
        "shapes": {str(k): list(stored[k].shape[1:]) for k in stored.keys(True, True)},
        "dtypes": {str(k): str(stored[k].dtype) for k in stored.keys(True, True)},
        "trajectories": len(ids.unique()),
        "breaks": breaks,
    }


def run_torchrl_fills(
    runs: list[tuple[str, str]], directory: Path, **options: Any
) -> list[dict[str, Any]]:
    """`fill()` with TorchRL's collectors, for each `(builder, kind)` of `runs`, in one Python
    process of its own (a child of the script zygote, TorchRL's workers forked: see
    `torchrl_side`)."""
    request = {"runs": runs, "directory": str(directory), "options": options}
    return list(run_side(request, "fill", timeout=240))


def fill_all(request: dict[str, Any]) -> None:
    """In the side process (`torchrl_side.main`): fill a buffer with each TorchRL collector
    asked for, print what each holds."""
    import torchrl.collectors as collectors

    directory = Path(request["directory"])
    runs = [fill(collectors, *run, directory, **request["options"]) for run in request["runs"]]
    sys.stdout.write(json.dumps(runs) + "\n")

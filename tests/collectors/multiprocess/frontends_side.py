"""Parts for the side-by-side tests of TorchRL-facing behaviour of the collectors (the compile
attributes, a compile backend that records where it compiled, an env maker holding a shared
`multiprocessing` counter), and TorchRL's side of them, run as a script in a child of the
script zygote (as `torchrl_side.py` runs TorchRL's collectors: their queues' semaphores are
not charged to ours by the leak checks; its workers are forked).

Both sides build their collectors over the same parts, defined here: a TorchRL CartPole whose
episodes last 5 steps and whose resets are counted by TorchRL's `TrajCounter`, handed over as
a TorchRL `EnvCreator` (whose calls share the counter's `multiprocessing.Value`).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
EPISODE_STEPS = 5
TRAJ_COUNT = "traj_count"


class RecordingBackend:
    """A `torch.compile` backend that records, in files under `directory`, which process
    compiled a graph (`graph-<pid>-<n>`) and each call of a compiled graph (a line in
    `calls-<pid>`): what a worker compiled is seen from the parent. The graph runs as traced."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def __call__(self, graph: Any, example_inputs: list[Any]) -> Any:
        pid = os.getpid()
        graphs = len(list(self.directory.glob(f"graph-{pid}-*")))
        (self.directory / f"graph-{pid}-{graphs}").touch()
        calls = self.directory / f"calls-{pid}"

        def run(*args: Any) -> Any:
            with calls.open("a") as file:
                file.write("call\n")
            return graph.forward(*args)

        return run

    def graph_pids(self) -> set[int]:
        """The processes that compiled a graph."""
        return {int(path.name.split("-")[1]) for path in self.directory.glob("graph-*")}

    def calls(self) -> dict[int, int]:
        """Calls of compiled graphs, by process."""
        return {
            int(path.name.split("-")[1]): len(path.read_text().splitlines())
            for path in self.directory.glob("calls-*")
        }


def counted_cartpole() -> Any:
    """TorchRL's CartPole, episodes cut at 5 steps, each reset counted by a `TrajCounter`."""
    from torchrl.envs import Compose, GymEnv, StepCounter, TrajCounter, TransformedEnv

    return TransformedEnv(
        GymEnv("CartPole-v1"), Compose(StepCounter(max_steps=EPISODE_STEPS), TrajCounter())
    )


def shared_counter_maker() -> Any:
    """A TorchRL `EnvCreator` over `counted_cartpole`: every env it makes (in any process it
    reaches) counts in one shared `multiprocessing.Value`."""
    from torchrl.envs import EnvCreator

    return EnvCreator(counted_cartpole)


def counts_per_worker(batch: Any) -> list[list[int]]:
    """The sorted trajectory counts each worker's part of a `[workers, T]` batch holds."""
    counts = batch["next", TRAJ_COUNT].reshape(batch.shape[0], -1)
    return [sorted({int(value) for value in row}) for row in counts]


def compile_attributes(collector: Any) -> dict[str, Any]:
    """TorchRL's compile attributes of `collector`, as JSON-friendly values."""
    return {
        name: getattr(collector, name) if "kwargs" not in name else dict(getattr(collector, name))
        for name in (
            "compiled_policy",
            "compiled_policy_kwargs",
            "cudagraphed_policy",
            "cudagraphed_policy_kwargs",
        )
    }


# --- TorchRL's side (in the side process) ---------------------------------------------------------


def run_torchrl_side(task: str, request: dict[str, Any], timeout: float = 200) -> Any:
    """Run this file as a script on `request` in a child of the script zygote; the JSON of its
    last line of output. A failure is raised with its errors."""
    from tests.examples.script_runner import zygote

    argv = [__file__, task, json.dumps(request)]
    done = zygote().run(argv, dict(os.environ), timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"TorchRL's collectors failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def torchrl_compile_attributes(request: dict[str, Any]) -> dict[str, Any]:
    """TorchRL's `builder(2 makers, compile_policy=...)`: its compile attributes."""
    import torchrl.collectors as collectors

    collector = getattr(collectors, request["builder"])(
        [counted_cartpole] * 2,
        None,
        frames_per_batch=20,
        total_frames=20,
        compile_policy=request["compile_policy"],
    )
    try:
        return compile_attributes(collector)
    finally:
        collector.shutdown()


def torchrl_shared_counts(request: dict[str, Any]) -> dict[str, Any]:
    """TorchRL's MultiSyncCollector over two calls of one `shared_counter_maker()`: the counts
    each worker saw in each batch, and the shared counter's value in this process after."""
    from torchrl.collectors import MultiSyncCollector

    maker = shared_counter_maker()
    collector = MultiSyncCollector(
        [maker, maker],
        None,
        frames_per_batch=request["frames_per_batch"],
        total_frames=request["frames_per_batch"] * request["batches"],
        cat_results="stack",
    )
    try:
        batches = [counts_per_worker(batch) for batch in collector]
    finally:
        collector.shutdown()
    return {"batches": batches, "parent_count": int(maker._mp_values[0][1].value)}


def torchrl_shared_statistics(request: dict[str, Any]) -> dict[str, float]:
    """TorchRL's MultiSyncCollector over two makers sharing `VecNormV2` statistics in shared
    memory (`shared_board.count_in_shared_statistics`)."""
    from torchrl.collectors import MultiSyncCollector

    from tests.collectors.multiprocess.shared_board import count_in_shared_statistics

    return count_in_shared_statistics(
        MultiSyncCollector, request["frames_per_batch"], request["batches"]
    )


def main(task: str, request: dict[str, Any]) -> None:
    """The side process: TorchRL's workers forked, `task` done, the process ended at once."""
    multiprocessing.set_start_method("fork", force=True)
    tasks = {
        "compile": torchrl_compile_attributes,
        "shared_counts": torchrl_shared_counts,
        "shared_statistics": torchrl_shared_statistics,
    }
    sys.stdout.write(json.dumps(tasks[task](request)) + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # run as a script: the repository's packages importable
    main(sys.argv[1], json.loads(sys.argv[2]))

"""Frames/s against the number of envs: our collectors, TorchRL's, plain Gymnasium / EnvPool loops.

CartPole-v1 with the benchmark MLP (`collectors.SamplingPolicy`, one sampled action per env per
step) and Pong-v5 through EnvPool (84x84x4 uint8) with CleanRL's Nature CNN, one torch thread.
At each number of envs the implementations run in one fresh interpreter and take turns (a batch,
or a loop step, at a time for about `--seconds / --chunks` each), keeping the median of each
one's turns, so that other load on the machine hits them alike; those with worker processes
(ours multi-process, TorchRL's `ParallelEnv`) run alone. Writes
`benchmarks/results/scaling_<env>.csv` and a plot `scaling_<env>.png` (frames/s against envs,
log-log), and prints the table and the ratios the scaling issues ask for. The plain loops count
transitions: the step where an env only resets (next-step autoreset) is not one, as in our
collectors. TorchRL's `MultiThreadedEnv` rows need the `gym` and `treevalue` packages (TorchRL
drives EnvPool through its `gym` API); without them they fail alone.

    python benchmarks/scaling.py                      # CartPole and Pong (~20 minutes)
    python benchmarks/scaling.py --env cartpole --envs 64 256 --impls ours-serial gym-loop
    python benchmarks/scaling.py --quick              # short run: 2 short turns per row
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from collectors import SamplingPolicy
from torch import nn

RESULTS = Path(__file__).resolve().parent / "results"
CARTPOLE, PONG = "CartPole-v1", "Pong-v5"
ENV_THREADS = 2  # EnvPool's threads (`envpool.make(..., num_threads=2)`), the machine's cores
MIN_BATCH_FRAMES = 1000


# --- policies -------------------------------------------------------------------------------


class NatureCNN(nn.Module):
    """CleanRL's Atari network (`ppo_atari_envpool.py`): 3 convs, 512 units, and a sampled
    one-hot action from the actor's logits (the critic is not needed to collect)."""

    def __init__(self, actions: int = 6) -> None:
        super().__init__()
        self.network = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, 512),
            nn.ReLU(),
        )
        self.actor = nn.Linear(512, actions)
        self.actions = actions

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        """Any leading dims (none for one env's `[4, 84, 84]` frames)."""
        frames = observation.reshape(-1, *observation.shape[-3:])
        logits = self.actor(self.network(frames.float() / 255.0))
        index = torch.distributions.Categorical(logits=logits).sample()
        action = nn.functional.one_hot(index, self.actions)
        return action.reshape(*observation.shape[:-3], self.actions)


class ActionIndex(nn.Module):
    """The same policy giving the action's index, for envs with categorical actions."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.policy(observation).argmax(-1)


def policy_for(env_id: str) -> nn.Module:
    torch.manual_seed(0)
    return NatureCNN() if env_id == PONG else SamplingPolicy()


def module_for(env_id: str, index_actions: bool = False) -> nn.Module:
    from tensordict.nn import TensorDictModule

    policy = policy_for(env_id)
    if index_actions:
        policy = ActionIndex(policy)
    return TensorDictModule(policy, in_keys=["observation"], out_keys=["action"])


def frames_per_batch(env_id: str, num_envs: int) -> int:
    """At least 1,000 frames and 32 steps (16 for Pong's large frames) per batch."""
    steps = 16 if env_id == PONG else 32
    return num_envs * max(steps, math.ceil(MIN_BATCH_FRAMES / num_envs))


# --- frame streams: each implementation yields the frames of each batch (or loop step) ------


Stream = Iterator[int]


def collector_stream(collector: Any) -> Stream:
    try:
        for batch in collector:
            yield batch.numel()
    finally:
        collector.shutdown()


# --- plain loops ------------------------------------------------------------------------------


def gym_loop(env_id: str, num_envs: int) -> Stream:
    """A plain Gymnasium `SyncVectorEnv` loop (one `gym.make` env at 1)."""
    import gymnasium as gym

    policy = policy_for(env_id)
    if num_envs == 1:
        env = gym.make(env_id)
        observation, _ = env.reset(seed=0)
        while True:
            action = int(policy(torch.as_tensor(observation)).argmax())
            observation, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                observation, _ = env.reset()
            yield 1
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * num_envs)
    observation, _ = envs.reset(seed=0)
    yield from transitions(envs, policy, observation)


def transitions(envs: Any, policy: nn.Module, observation: Any) -> Stream:
    """Step a vector env that autoresets on the next step (Gymnasium's default, EnvPool's),
    yielding the transitions of each step: an env that ended at the step before only resets
    in this one, which is no transition (as the issue counts frames, and our collectors)."""
    ended = 0
    while True:
        action = policy(torch.as_tensor(observation)).argmax(-1).numpy()
        observation, _, terminated, truncated, _ = envs.step(action)
        yield len(action) - ended
        ended = int((terminated | truncated).sum())


def make_envpool(env_id: str, num_envs: int) -> Any:
    import envpool

    threads = min(ENV_THREADS, num_envs)
    return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, num_threads=threads)


def envpool_loop(env_id: str, num_envs: int) -> Stream:
    """A plain EnvPool loop (its own next-step autoreset), as CleanRL's `ppo_atari_envpool.py`."""
    envs = make_envpool(env_id, num_envs)
    policy = policy_for(env_id)
    observation, _ = envs.reset()
    yield from transitions(envs, policy, observation)


# --- our collectors ---------------------------------------------------------------------------


def ours_collector(env: Any, env_id: str, num_envs: int) -> Stream:
    from rlcollect import Collector
    from rlcollect.envs.specs import Categorical

    policy = module_for(env_id, isinstance(env.action_spec, Categorical))
    batch = frames_per_batch(env_id, num_envs)
    return collector_stream(Collector(env, policy, frames_per_batch=batch))


def ours_serial(env_id: str, num_envs: int) -> Stream:
    from rlcollect.envs import SerialEnv

    return ours_collector(SerialEnv(num_envs, env_id), env_id, num_envs)


def ours_vector(env_id: str, num_envs: int) -> Stream:
    from rlcollect.envs import GymVectorEnv

    return ours_collector(GymVectorEnv(env_id, num_envs), env_id, num_envs)


def ours_envpool(env_id: str, num_envs: int) -> Stream:
    from rlcollect.envs import EnvPoolEnv  # type: ignore[attr-defined]

    env = EnvPoolEnv(env_id, num_envs=num_envs, num_threads=min(ENV_THREADS, num_envs))
    return ours_collector(env, env_id, num_envs)


def ours_envpool_pools(env_id: str, num_envs: int) -> Stream:
    """`EnvPoolEnv` in its send / recv mode: two pools of half the envs, one EnvPool thread
    each (the same two threads), so one pool's finished envs reset while the other steps."""
    from rlcollect.envs import EnvPoolEnv  # type: ignore[attr-defined]

    pools = min(2, num_envs)
    env = EnvPoolEnv(env_id, num_envs=num_envs, batch_size=num_envs // pools, num_threads=1)
    return ours_collector(env, env_id, num_envs)


def ours_multi(env_id: str, num_envs: int) -> Stream:
    """`MultiSyncCollector`: 2 worker processes, each stepping `SerialEnv(num_envs / 2)`."""
    from rlcollect.collectors import MultiSyncCollector
    from rlcollect.envs import SerialEnv

    workers = min(2, num_envs)
    collector = MultiSyncCollector(
        lambda: SerialEnv(num_envs // workers, env_id),
        module_for(env_id),
        num_workers=workers,
        frames_per_batch=frames_per_batch(env_id, num_envs),
    )
    return collector_stream(collector)


def _count_serial_frames(env_id: str, num_envs: int, counter: Any) -> None:
    """A process of `serial_pair_ceiling`: a one-process collector on `num_envs` envs,
    adding the frames of each batch to `counter` until it is terminated."""
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    for frames in ours_serial(env_id, num_envs):
        with counter.get_lock():
            counter.value += frames


def serial_pair_ceiling(env_id: str, num_envs: int) -> Stream:
    """Not a collector: two independent processes, each running `ours-serial` on half the
    envs, with nothing shared and nothing awaited between them; the frames both collect.
    What any 2-worker collector could reach on this machine (no gathering, no round)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    counter = context.Value("q", 0)
    workers = [
        context.Process(
            target=_count_serial_frames, args=(env_id, num_envs // 2, counter), daemon=True
        )
        for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    try:
        while counter.value == 0:  # both started (a warm-up batch each)
            time.sleep(0.05)
        while True:
            before = counter.value
            time.sleep(0.05)
            yield counter.value - before
    finally:
        for worker in workers:
            worker.terminate()
            worker.join()


def envpool_half(env_id: str, num_envs: int) -> Any:
    """One worker's EnvPool env: half the envs, one EnvPool thread (two workers, two cores)."""
    from rlcollect.envs import EnvPoolEnv  # type: ignore[attr-defined]

    return EnvPoolEnv(env_id, num_envs=num_envs, num_threads=1)


def ours_multi_envpool(env_id: str, num_envs: int, asynchronous: bool = False) -> Stream:
    """`MultiSyncCollector` (or `MultiAsyncCollector`): 2 worker processes, each stepping an
    `EnvPoolEnv` of half the envs with one EnvPool thread: one worker's policy runs while the
    other's envs step."""
    from rlcollect.collectors import MultiAsyncCollector, MultiSyncCollector
    from rlcollect.envs.specs import Categorical

    workers = min(2, num_envs)
    make = functools.partial(envpool_half, env_id, num_envs // workers)
    index_actions = isinstance(make().action_spec, Categorical)
    collector_class = MultiAsyncCollector if asynchronous else MultiSyncCollector
    collector = collector_class(
        [make] * workers,
        module_for(env_id, index_actions),
        frames_per_batch=frames_per_batch(env_id, num_envs),
    )
    return collector_stream(collector)


def ours_async_envpool(env_id: str, num_envs: int) -> Stream:
    return ours_multi_envpool(env_id, num_envs, asynchronous=True)


# --- TorchRL's collector ----------------------------------------------------------------------


def torchrl_collector(env: Any, env_id: str, num_envs: int) -> Stream:
    from torchrl.collectors import Collector
    from torchrl.data import Categorical

    index_actions = isinstance(env.action_spec, Categorical)
    collector = Collector(
        env,
        module_for(env_id, index_actions),
        frames_per_batch=frames_per_batch(env_id, num_envs),
        total_frames=-1,
    )
    return collector_stream(collector)


def torchrl_serial(env_id: str, num_envs: int) -> Stream:
    from torchrl.envs import GymEnv, SerialEnv

    return torchrl_collector(SerialEnv(num_envs, lambda: GymEnv(env_id)), env_id, num_envs)


def torchrl_parallel(env_id: str, num_envs: int) -> Stream:
    """TorchRL's `ParallelEnv` of 2 worker processes, each a `SerialEnv` of `num_envs / 2`."""
    from torchrl.envs import GymEnv, ParallelEnv, SerialEnv

    workers = min(2, num_envs)
    per_worker = num_envs // workers
    env = ParallelEnv(workers, lambda: SerialEnv(per_worker, lambda: GymEnv(env_id)))
    return torchrl_collector(env, env_id, num_envs)


def register_gymnasium_spaces() -> None:
    """Let TorchRL's `MultiThreadedEnv` read EnvPool's spaces.

    It asks EnvPool for its `gym` API (so the `gym` and `treevalue` packages must be
    installed) and converts the spaces under TorchRL's "gym" backend, but EnvPool 1.x hands
    Gymnasium spaces even there: their converters are registered for the Gymnasium classes.
    """
    import gymnasium
    from torchrl.envs.libs.gym import _conversion_registry, register_gym_spec_conversion

    for name, space in (
        ("discrete.Discrete", gymnasium.spaces.Discrete),
        ("Box", gymnasium.spaces.Box),
    ):
        register_gym_spec_conversion(space)(_conversion_registry.data[name])


def torchrl_multithreaded(env_id: str, num_envs: int) -> Stream:
    from torchrl.envs import MultiThreadedEnv

    register_gymnasium_spaces()
    threads = {"num_threads": min(ENV_THREADS, num_envs)}
    env = MultiThreadedEnv(num_envs, env_id, create_env_kwargs=threads)
    return torchrl_collector(env, env_id, num_envs)


IMPLEMENTATIONS: dict[str, Callable[[str, int], Stream]] = {
    "ours-serial": ours_serial,
    "ours-vector": ours_vector,
    "ours-envpool": ours_envpool,
    "ours-envpool-pools": ours_envpool_pools,
    "ours-multi": ours_multi,
    "serial-pair-ceiling": serial_pair_ceiling,
    "ours-multi-envpool": ours_multi_envpool,
    "ours-async-envpool": ours_async_envpool,
    "torchrl-serial": torchrl_serial,
    "torchrl-parallel": torchrl_parallel,
    "torchrl-multithreaded": torchrl_multithreaded,
    "gym-loop": gym_loop,
    "envpool-loop": envpool_loop,
}
# Pong runs through EnvPool only (no ALE in the Gymnasium install).
# TorchRL's SerialEnv runs about 1,500 CartPole frames/s whatever the number of envs: a batch of
# 1,024 envs would take half a minute, so its rows stop here.
MAX_ENVS = {"torchrl-serial": 256, "torchrl-parallel": 256}
# Worker processes compete for the cores with whatever runs beside them: measured alone.
ISOLATED = {
    "ours-multi",
    "ours-multi-envpool",
    "ours-async-envpool",
    "torchrl-parallel",
    "serial-pair-ceiling",
}
PONG_IMPLEMENTATIONS = [
    "ours-envpool",
    "ours-envpool-pools",
    "ours-multi-envpool",
    "ours-async-envpool",
    "torchrl-multithreaded",
    "envpool-loop",
]
ENVS = {"cartpole": CARTPOLE, "pong": PONG}
DEFAULT_SIZES = {"cartpole": [1, 8, 64, 256, 1024], "pong": [1, 8, 32, 128]}

# (env, numerator, denominator, target, envs): the ratios the scaling issue asks for
TARGETS = [
    ("cartpole", "ours-serial", "gym-loop", 1.0, (8, 64, 256)),
    ("cartpole", "ours-multi", "ours-serial", 1.8, (64, 256)),
    # The machine's own ceiling for the line above: two independent one-process collectors.
    ("cartpole", "serial-pair-ceiling", "ours-serial", 1.8, (64, 256)),
    ("cartpole", "ours-envpool", "envpool-loop", 1.0, (256,)),
    ("cartpole", "ours-best", "envpool-loop", 0.9, (256,)),
    ("cartpole", "ours-envpool-pools", "envpool-loop", 0.9, (256,)),
    ("pong", "ours-best", "envpool-loop", 0.9, (8, 32)),
    ("pong", "ours-envpool", "envpool-loop", 0.9, (8, 32)),
    ("pong", "ours-envpool-pools", "envpool-loop", 0.9, (8, 32)),
    ("pong", "ours-best", "torchrl-multithreaded", 4.0, (8, 32)),
]


# --- running ----------------------------------------------------------------------------------


def time_streams(streams: dict[str, Stream], seconds: float, chunks: int) -> dict[str, float]:
    """Median frames/s of each stream over `chunks` turns of about `seconds / chunks` each,
    the streams taking turns (after one untimed warm-up item each) so that a change in the
    machine's load hits them alike, and one lucky turn does not move the result."""
    for stream in streams.values():
        next(stream)
    rates: dict[str, list[float]] = {name: [] for name in streams}
    turn = seconds / chunks
    for _ in range(chunks):
        for name, stream in streams.items():
            start, frames = time.perf_counter(), 0
            while frames == 0 or time.perf_counter() - start < turn:
                frames += next(stream)
            rates[name].append(frames / (time.perf_counter() - start))
    for stream in streams.values():
        stream.close()  # type: ignore[attr-defined]
    return {name: statistics.median(turns) for name, turns in rates.items()}


def run_point(
    env_id: str, num_envs: int, implementations: list[str], seconds: float, chunks: int
) -> dict[str, float | str]:
    """Frames/s of `implementations` at one number of envs, in this process, taking turns;
    an implementation that fails to start gets the tail of its error instead."""
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    streams: dict[str, Stream] = {}
    failed: dict[str, float | str] = {}
    for name in implementations:
        try:
            streams[name] = IMPLEMENTATIONS[name](env_id, num_envs)
            next(streams[name])  # builds it: a generator starts on its first item
        except Exception as err:  # a missing optional package fails its row, not the run
            streams.pop(name, None)
            failed[name] = f"{type(err).__name__}: {err}"[-300:]
    return {**time_streams(streams, seconds, chunks), **failed}


def run_isolated(
    env_id: str, num_envs: int, implementations: list[str], args: argparse.Namespace
) -> dict[str, float | str]:
    """`run_point` in a fresh interpreter: its results, or the tail of its error for each."""
    command = [sys.executable, __file__, "--point", env_id, str(num_envs), *implementations]
    command += ["--seconds", str(args.seconds), "--chunks", str(args.chunks)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return dict.fromkeys(implementations, done.stderr.strip()[-300:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(
    env: str, sizes: list[int], implementations: list[str], args: argparse.Namespace
) -> dict[tuple[str, int], float]:
    """Frames/s of each (implementation, envs): at each number of envs, the implementations
    that run in this process take turns in one fresh interpreter; those with worker
    processes run alone, each in its own."""
    env_id = ENVS[env]
    results: dict[tuple[str, int], float] = {}
    for num_envs in sizes:
        fitting = [name for name in implementations if num_envs <= MAX_ENVS.get(name, num_envs)]
        shared = [name for name in fitting if name not in ISOLATED]
        groups = [shared] if shared else []
        groups += [[name] for name in fitting if name in ISOLATED and num_envs >= 2]
        for group in groups:
            if args.in_process:
                point = run_point(env_id, num_envs, group, args.seconds, args.chunks)
            else:
                point = run_isolated(env_id, num_envs, group, args)
            for name, result in point.items():
                if isinstance(result, str):
                    print(f"{env:8} {num_envs:5} {name:22} FAILED: {result}")
                    continue
                print(f"{env:8} {num_envs:5} {name:22} {result:>12.0f}", flush=True)
                results[name, num_envs] = result
    return results


def with_best(results: dict[tuple[str, int], float]) -> dict[tuple[str, int], float]:
    """`results` with an "ours-best" row: the fastest of our collectors at each size."""
    merged = dict(results)
    for (implementation, num_envs), fps in results.items():
        if implementation.startswith("ours-"):
            merged["ours-best", num_envs] = max(merged.get(("ours-best", num_envs), 0.0), fps)
    return merged


def write_csv(path: Path, env: str, results: dict[tuple[str, int], float]) -> None:
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["env", "implementation", "num_envs", "frames_per_s"])
        for (implementation, num_envs), fps in sorted(results.items()):
            writer.writerow([ENVS[env], implementation, num_envs, f"{fps:.0f}"])


def plot(path: Path, env: str, results: dict[tuple[str, int], float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for implementation in IMPLEMENTATIONS:
        points = sorted((n, fps) for (name, n), fps in results.items() if name == implementation)
        if points:
            style = "-o" if implementation.startswith("ours-") else "--s"
            axes.plot(*zip(*points, strict=True), style, label=implementation, markersize=4)
    axes.set(xscale="log", yscale="log", xlabel="envs", ylabel="frames/s")
    axes.set_title(f"{ENVS[env]}: frames/s against the number of envs (1 torch thread)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def print_table(env: str, results: dict[tuple[str, int], float]) -> None:
    sizes = sorted({n for _, n in results})
    print(f"\n{ENVS[env]} frames/s")
    print(f"{'implementation':22}" + "".join(f"{n:>10}" for n in sizes))
    for implementation in [*IMPLEMENTATIONS, "ours-best"]:
        cells = [results.get((implementation, n)) for n in sizes]
        if any(cell is not None for cell in cells):
            row = "".join("         -" if c is None else f"{c:>10.0f}" for c in cells)
            print(f"{implementation:22}{row}")


def print_ratios(env: str, results: dict[tuple[str, int], float]) -> None:
    print("ratios (target):")
    for target_env, ours, other, target, sizes in TARGETS:
        for num_envs in sizes:
            if target_env != env or (ours, num_envs) not in results:
                continue
            if (other, num_envs) not in results:
                continue
            ratio = results[ours, num_envs] / results[other, num_envs]
            verdict = "ok" if ratio >= target else "BELOW TARGET"
            print(
                f"  {num_envs:5} envs  {ours} / {other:22} {ratio:6.2f}x  (>= {target}x) {verdict}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short run: 1 round, short timing")
    parser.add_argument("--env", choices=[*ENVS, "all"], default="all")
    parser.add_argument("--envs", type=int, nargs="*", help="numbers of envs (default per env)")
    parser.add_argument("--impls", nargs="*", choices=list(IMPLEMENTATIONS), default=None)
    parser.add_argument("--chunks", type=int, default=None, help="turns of each implementation")
    parser.add_argument("--seconds", type=float, default=None, help="timed seconds per row")
    parser.add_argument("--in-process", action="store_true", help="no fresh interpreter each")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the CSV and plot go")
    parser.add_argument("--point", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.chunks = args.chunks or (2 if args.quick else 8)
    args.seconds = args.seconds or (0.4 if args.quick else 8.0)
    if args.point:
        env_id, num_envs, *implementations = args.point
        point = run_point(env_id, int(num_envs), implementations, args.seconds, args.chunks)
        print(json.dumps(point))
        return
    print(
        f"median of {args.chunks} turns per row, {args.seconds} s timed per row, the rows of "
        "one number of envs taking turns in one interpreter (worker-process rows alone)"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    for env in ENVS if args.env == "all" else [args.env]:
        sizes = args.envs or DEFAULT_SIZES[env]
        implementations = args.impls or (
            PONG_IMPLEMENTATIONS if env == "pong" else list(IMPLEMENTATIONS)
        )
        results = with_best(measure(env, sizes, implementations, args))
        write_csv(args.out / f"scaling_{env}.csv", env, results)
        plot(args.out / f"scaling_{env}.png", env, results)
        print_table(env, results)
        print_ratios(env, results)
        print(f"wrote {args.out / f'scaling_{env}.csv'} and scaling_{env}.png")


if __name__ == "__main__":
    main()

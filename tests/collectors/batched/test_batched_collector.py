"""AsyncBatchedCollector with real worker processes: batches, answers, weights, faults."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from rlcollect import keys
from rlcollect.collectors import AsyncBatchedCollector
from rlcollect.collectors.batched import InferenceServerError
from rlcollect.errors import WorkerError
from rlcollect.replay import LazyTensorStorage, ReplayBuffer
from rlcollect.testing.counting import CountingEnv
from tests.collectors.batched.batched_parts import (
    LENGTHS,
    OverlapRecord,
    counting_env,
    echo_module,
    slow_echo_module,
)
from tests.conftest import processes_gone

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]


def makers(count: int = 4) -> list:
    return [functools.partial(counting_env, LENGTHS[i % len(LENGTHS)]) for i in range(count)]


def torn_down(pid: int, within: float) -> bool:
    """Whether every thread of process `pid` has ended (zombie or gone) within `within` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            tasks = [task.read_text() for task in Path(f"/proc/{pid}/task").glob("*/stat")]
        except OSError:
            return True
        if all(stat.rsplit(")", 1)[1].split()[0] in "ZX" for stat in tasks):
            return True
        time.sleep(0.01)
    return False


def take_batches(collector: AsyncBatchedCollector, count: int) -> None:
    """Take `count` batches (a failure may let a chunk or two already on its way through)."""
    for _ in range(count):
        collector.next()


def check_answers(batch: TensorDictBase, biases: dict[int, float]) -> None:
    """Every frame's answer is the policy of its version on its own observation."""
    versions = batch.get(keys.POLICY_VERSION)
    expected_bias = torch.zeros(versions.shape)
    for version, bias in biases.items():
        expected_bias[versions == version] = bias
    assert set(versions.unique().tolist()) <= set(biases)
    expected = batch.get("observation") * 10.0 + expected_bias.unsqueeze(-1)
    assert torch.equal(batch.get("echo"), expected)


def check_trajectories(batch: TensorDictBase) -> None:
    """Within each row, the trajectory id changes exactly after a done step, the observation
    counts from 0 after it; an id in two rows (two chunks of one env: a fast worker may give
    two to one batch) ends the first and starts the second, where the env went on."""
    ids = batch.get(keys.TRAJ_IDS)
    done = batch.get(("next", "done")).squeeze(-1)
    observation = batch.get("observation").squeeze(-1)
    for row in range(batch.shape[0]):
        changes = ids[row, 1:] != ids[row, :-1]
        assert torch.equal(changes, done[row, :-1])
        assert bool((observation[row, 1:][done[row, :-1]] == 0).all())
    next_observation = batch.get(("next", "observation")).squeeze(-1)
    for first in range(batch.shape[0]):
        for second in range(first + 1, batch.shape[0]):
            shared = set(ids[first].tolist()) & set(ids[second].tolist())
            if shared:
                assert shared == {int(ids[first, -1])} == {int(ids[second, 0])}
                assert observation[second, 0] == next_observation[first, -1]


def test_batches_are_whole_chunks_answered_by_their_own_observations() -> None:
    with AsyncBatchedCollector(
        makers(4),
        policy=echo_module(0.5),
        frames_per_batch=48,
        total_frames=480,
        transition_chunk_size=12,
        max_batch_size=4,
    ) as collector:
        batches = list(collector)
        stats = collector.server_stats()
    assert len(batches) == 10
    for batch in batches:
        assert batch.shape == (4, 12)
        assert batch.names == [None, "time"]
        check_answers(batch, {0: 0.5})
        check_trajectories(batch)
    assert stats["requests"] >= 480
    all_ids = torch.cat([batch.get(keys.TRAJ_IDS).flatten() for batch in batches])
    # One worker's trajectories continue across its chunks; the ids of the four never meet.
    workers_of_id = {int(i) % 4 for i in all_ids.unique()}
    assert workers_of_id == {0, 1, 2, 3}


def test_the_server_batches_the_requests_of_several_workers() -> None:
    with AsyncBatchedCollector(
        makers(4),
        policy=echo_module(),
        frames_per_batch=80,
        total_frames=320,
        transition_chunk_size=20,
        max_batch_size=4,
        min_batch_size=4,
        server_timeout=5.0,
    ) as collector:
        for batch in collector:
            check_answers(batch, {0: 0.0})
        stats = collector.server_stats()
    # Every forward waited for all four workers (the last ones may be fewer as chunks end).
    assert stats["avg_batch_size"] > 3.5, stats


def test_weight_updates_are_acknowledged_and_each_frame_names_its_version() -> None:
    policy = echo_module(0.0)
    with AsyncBatchedCollector(
        makers(2), policy=policy, frames_per_batch=20, transition_chunk_size=10, max_batch_size=2
    ) as collector:
        check_answers(collector.next(), {0: 0.0})
        with torch.no_grad():
            policy.module.bias.fill_(1.0)
        # Not sent yet: the server serves its own copy, never the trainer's module.
        collector.next()
        collector.update_policy_weights_()
        assert collector.policy_version == 1
        assert collector.server_stats()["policy_version"] == 1
        seen: set[int] = set()
        for _ in range(4):
            batch = collector.next()
            check_answers(batch, {0: 0.0, 1: 1.0})
            seen |= set(batch.get(keys.POLICY_VERSION).unique().tolist())
        assert 1 in seen
        collector.update_policy_weights_({"module.bias": torch.tensor(2.0)})
        batch = collector.next()
        check_answers(batch, {1: 1.0, 2: 2.0})
        with pytest.raises(ValueError, match=r"do not fit the served policy: missing"):
            collector.update_policy_weights_({"module.weight": torch.tensor(2.0)})


@pytest.mark.parametrize("concurrent_forwards", [1, 2])
def test_concurrent_forwards_overlap_and_every_answer_is_its_own(concurrent_forwards: int) -> None:
    OverlapRecord.reset()
    policy = slow_echo_module(0.0)
    with AsyncBatchedCollector(
        makers(4),
        policy=policy,
        frames_per_batch=40,
        transition_chunk_size=10,
        max_batch_size=1,
        concurrent_forwards=concurrent_forwards,
        exploration_type=InteractionType.DETERMINISTIC,
    ) as collector:
        check_answers(collector.next(), {0: 0.0})
        with torch.no_grad():
            policy.module.bias.fill_(1.0)
        collector.update_policy_weights_()  # waits until no forward runs
        for _ in range(3):
            batch = collector.next()
            check_answers(batch, {0: 0.0, 1: 1.0})
            check_trajectories(batch)
        stats = collector.server_stats()
    # One row per forward, and as many forwards at once as asked (4 workers keep 2 busy).
    assert stats["avg_batch_size"] == 1.0
    assert OverlapRecord.most_at_once == concurrent_forwards
    # Each forward ran under the collector's interaction type from start to end.
    assert OverlapRecord.changed == []
    assert not [t for t in threading.enumerate() if t.name.startswith("rlcollect-inference")]


def test_a_server_process_runs_concurrent_forwards_and_takes_weights() -> None:
    from torchrl.modules.inference_server import InferenceServerConfig

    with AsyncBatchedCollector(
        makers(4),
        policy_factory=functools.partial(slow_echo_module, 0.5),
        frames_per_batch=40,
        transition_chunk_size=10,
        concurrent_forwards=2,
        server_config=InferenceServerConfig(service_backend="process", max_batch_size=1),
    ) as collector:
        server_pid = collector._server.pid
        check_answers(collector.next(), {0: 0.5})
        collector.update_policy_weights_(echo_module(2.0))  # the command meets running forwards
        for _ in range(3):
            check_answers(collector.next(), {0: 0.5, 1: 2.0})
        stats = collector.server_stats()
    assert stats["policy_version"] == 1
    assert stats["avg_batch_size"] == 1.0
    assert processes_gone([server_pid], 5)


@pytest.fixture
def more_torch_threads_than_cores() -> Iterator[None]:
    """This process runs more torch threads than the machine has cores while the test runs."""
    before = torch.get_num_threads()
    torch.set_num_threads((os.cpu_count() or 1) + 1)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("more_torch_threads_than_cores")
def test_a_server_process_serves_and_takes_weights() -> None:
    from torchrl.modules.inference_server import InferenceServerConfig

    # The server process gets the cores its 2 env workers leave, not this process's count.
    threads = max(1, (os.cpu_count() or 1) - 2)
    with AsyncBatchedCollector(
        makers(2),
        policy_factory=functools.partial(echo_module, 0.25),
        frames_per_batch=20,
        transition_chunk_size=10,
        server_config=InferenceServerConfig(service_backend="process", max_batch_size=2),
    ) as collector:
        assert collector.server_backend == "process"
        server_pid = collector._server.pid
        assert server_pid != os.getpid()
        check_answers(collector.next(), {0: 0.25})
        assert collector.server_stats()["torch_threads"] == threads
        collector.update_policy_weights_(echo_module(3.0))
        batch = collector.next()
        check_answers(batch, {0: 0.25, 1: 3.0})
        with pytest.raises(WorkerError, match=r"do not fit the served policy"):
            collector.update_policy_weights_({"bias": torch.ones(3)})
    assert processes_gone([server_pid], 5)


def test_several_envs_per_worker_and_completed_trajectories() -> None:
    # The envs one worker batches share their specs (a SerialEnv's rule): lengths 3, 3, 5, 5.
    with AsyncBatchedCollector(
        [functools.partial(counting_env, length) for length in (3, 3, 5, 5)],
        policy=echo_module(),
        frames_per_batch=16,
        total_frames=64,
        envs_per_worker=2,
        transition_chunk_size=4,
    ) as collector:
        assert collector.num_workers == 2
        for batch in collector:
            assert batch.shape == (4, 4)
            check_answers(batch, {0: 0.0})
            check_trajectories(batch)
    with AsyncBatchedCollector(
        makers(2),
        policy=echo_module(),
        frames_per_batch=1,
        total_frames=40,
        transition_chunk_size=3,
        yield_completed_trajectories=True,
    ) as collector:
        for trajectory in collector:
            assert trajectory.names == ["time"]
            counts = trajectory.get("observation").squeeze(-1)
            assert torch.equal(counts, torch.arange(len(counts), dtype=counts.dtype))
            assert bool(trajectory.get(("next", "done"))[-1])
            assert trajectory.get(keys.TRAJ_IDS).unique().numel() == 1


def test_the_policys_error_is_raised_with_the_servers_traceback() -> None:
    collector = AsyncBatchedCollector(
        makers(2), policy=echo_module(fail_at=2.0), frames_per_batch=20, transition_chunk_size=10
    )
    with pytest.raises(InferenceServerError, match=r"policy raised .*the policy broke at") as info:
        collector.next()
    assert "in forward" in str(info.value)  # the server's own traceback
    with pytest.raises(RuntimeError, match=r"shut down"):
        collector.next()


def test_a_killed_env_worker_is_reported_or_restarted() -> None:
    collector = AsyncBatchedCollector(
        makers(2), policy=echo_module(), frames_per_batch=20, transition_chunk_size=10
    )
    collector.next()
    victim = collector._inner.pool.pids[1]
    os.kill(victim, signal.SIGKILL)
    # Dead once the kernel has torn down every thread of it (a zombie leader with a thread
    # still exiting, `Zl`, keeps its sockets open): on a loaded machine that can take longer
    # than the other worker's next few chunks.
    assert torn_down(victim, within=30.0)
    with pytest.raises(WorkerError, match=r"worker 1 failed: .*died \(signal SIGKILL\)"):
        take_batches(collector, 2)
    assert not any(worker.is_alive() for worker in collector._workers)

    with AsyncBatchedCollector(
        makers(2),
        policy=echo_module(),
        frames_per_batch=20,
        transition_chunk_size=10,
        restart_dead_workers=True,
    ) as collector:
        collector.next()
        os.kill(collector._inner.pool.pids[0], signal.SIGKILL)
        ids: list[int] = [0]
        started = time.monotonic()
        # Until the restarted worker delivers (its start-up is seconds on a loaded machine,
        # while the other worker goes on), whose ids start past its predecessor's.
        while max(ids) <= 2**32 and time.monotonic() - started < 60:
            batch = collector.next()
            check_answers(batch, {0: 0.0})
            check_trajectories(batch)
            ids += batch.get(keys.TRAJ_IDS).unique().tolist()
        restarts = [worker["restarts"] for worker in collector.stats()["per_worker"]]
    assert restarts == [1, 0]
    assert max(ids) > 2**32, "the restarted worker delivered nothing within 60 s"


def test_a_killed_server_process_is_reported_and_nothing_is_left() -> None:
    from torchrl.modules.inference_server import InferenceServerConfig

    collector = AsyncBatchedCollector(
        makers(2),
        policy_factory=echo_module,
        frames_per_batch=20,
        transition_chunk_size=10,
        server_config=InferenceServerConfig(service_backend="process"),
    )
    collector.next()
    directory = collector._slots.directory
    block = Path("/dev/shm") / collector._slots.layout.name
    assert block.exists()
    started = time.monotonic()
    collector._server._process.kill()
    with pytest.raises(InferenceServerError, match=r"inference server died: .*SIGKILL"):
        take_batches(collector, 5)
    assert time.monotonic() - started < 10
    assert not block.exists()
    assert not Path(directory).exists()


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"policy_factory": echo_module}, TypeError, "mutually exclusive"),
        ({"policy": None}, TypeError, "must be provided"),
        ({"envs_per_worker": 3}, ValueError, r"envs_per_worker=3 must be a positive divisor of"),
        ({"max_batch_size": 2, "server_config": object()}, ValueError, "mutually exclusive"),
        ({"env_backend": "ray"}, ValueError, r"env_backend='ray' is not supported"),
        ({"min_batch_size": 9, "max_batch_size": 4}, ValueError, "above max_batch_size=4"),
        ({"concurrent_forwards": 0}, ValueError, r"concurrent_forwards=0 must be at least 1"),
        ({"transition_chunk_size": 0}, ValueError, "must be at least 1"),
        ({"worker_affinity": [[0]]}, ValueError, "worker_affinity and driver_affinity"),
    ],
)
def test_arguments_are_checked_with_messages_that_name_them(
    options: dict, error: type, message: str
) -> None:
    arguments = {"policy": echo_module(), "frames_per_batch": 20, **options}
    with pytest.raises(error, match=message):
        AsyncBatchedCollector(makers(2), **arguments)


def two_counting_envs() -> CountingEnv:
    return CountingEnv(episode_length=5, batch_size=(2,))


def test_a_maker_of_a_batched_env_is_refused_naming_its_batch_size() -> None:
    with pytest.raises(ValueError, match=r"batch size \[2\]; AsyncBatchedCollector serves one env"):
        AsyncBatchedCollector([two_counting_envs] * 2, policy=echo_module(), frames_per_batch=20)


def wait_until(condition: object, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_start_fills_a_shared_replay_buffer_with_every_frame_once() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(2000), shared=True)
    with AsyncBatchedCollector(
        makers(2),
        policy=echo_module(0.5),
        frames_per_batch=40,
        total_frames=400,
        transition_chunk_size=20,
        replay_buffer=buffer,
    ) as collector:
        collector.start()
        wait_until(lambda: buffer.write_count >= 400)
        time.sleep(0.2)
        collector.async_shutdown()
        assert collector.is_done
        assert collector.state_dict()["frames"] >= 400  # what it ended with: a last checkpoint
    assert buffer.write_count == 400
    stored = buffer[torch.arange(len(buffer))]
    check_answers(stored, {0: 0.5})
    ids = stored.get(keys.TRAJ_IDS).flatten().tolist()
    counts = stored.get("observation").flatten().long().tolist()
    assert len(set(zip(ids, counts, strict=True))) == len(ids), "a frame was written twice"
    buffer.close()

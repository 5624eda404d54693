"""RayReplayBuffer on a real local Ray cluster: the ReplayBuffer API from any process,
prioritized sampling remotely, and RayCollector actors filling it while the driver samples."""

from __future__ import annotations

import multiprocessing
import pickle
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from rlcollect import keys
from rlcollect.collectors import RayCollector
from rlcollect.errors import MisuseError
from rlcollect.replay import (
    LazyTensorStorage,
    ListStorage,
    PrioritizedSampler,
    RayReplayBuffer,
    ReplayBuffer,
)
from tests.collectors.ray.helpers import RAY_TEST_TIMEOUT, counting_env, extend_through

ray = pytest.importorskip("ray")

pytestmark = [
    pytest.mark.timeout(RAY_TEST_TIMEOUT),
    pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level"),
]


def frames(count: int, start: float = 0.0) -> TensorDict:
    return TensorDict({"observation": torch.arange(start, start + count)}, [count])


def test_the_replay_buffer_api_answers_from_the_actor(tmp_path: Path) -> None:
    with RayReplayBuffer(storage=LazyTensorStorage(100), batch_size=4) as rb:
        with pytest.raises(MisuseError, match=r"cannot sample from an empty replay buffer"):
            rb.sample()
        assert rb.extend(frames(10)).tolist() == list(range(10))
        assert (len(rb), rb.write_count, rb.batch_size) == (10, 10, 4)
        sample, info = rb.sample(return_info=True)
        assert sample["observation"].shape == (4,)
        assert torch.equal(sample["observation"], info["index"].float())
        assert rb.add(TensorDict({"observation": torch.tensor(42.0)}, [])) == 10
        assert float(rb[10]["observation"]) == 42.0
        state = rb.state_dict()
        rb.empty()
        assert len(rb) == 0
        rb.load_state_dict(state)
        assert len(rb) == 11
        # A client (what other processes get) reaches the same data.
        client = pickle.loads(pickle.dumps(rb.client()))
        client.extend(frames(2, start=100.0))
        assert (len(client), rb.write_count) == (13, 13)
        # Writes under a name are counted by name (a RayCollector's actors write so).
        client.extend_as("actor-0", frames(3))
        assert rb.written_by(["actor-0", "nobody"]) == [3, 0]
        assert rb.write_count == 16
        # Counted for good (its process ended): a write of its still on its way is refused,
        # so the count stays what the buffer holds; other writers go on.
        assert rb.written_by(["actor-0"], seal=True) == [3]
        with pytest.raises(MisuseError, match=r"writer 'actor-0' was counted for good"):
            client.extend_as("actor-0", frames(3))
        assert (rb.written_by(["actor-0"]), rb.write_count) == ([3], 16)
        client.extend_as("actor-1", frames(2))
        assert rb.write_count == 18
        with pytest.raises(TypeError, match=r"is not pickled; pass rb.client\(\)"):
            pickle.dumps(rb)
        rb.dumps(str(tmp_path / "saved"))
        rb.empty()
        rb.loads(str(tmp_path / "saved"))
        assert len(rb) == 18
    with pytest.raises(MisuseError, match=r"is closed; build a new one"):
        len(rb)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"storage": "big"}, TypeError, r"storage must be a Storage \(e.g. LazyTensorStorage"),
        ({"batch_size": 0}, ValueError, r"batch_size must be a positive int or None, got 0"),
        ({"remote_config": {"num_cpu": 1}}, ValueError, r"remote_config has 'num_cpu'"),
        ({"ray_init_config": {"adress": "auto"}}, TypeError, r"Did you mean 'address'\?"),
    ],
)
def test_bad_arguments_are_refused_with_the_buffers_own_message(
    kwargs: dict[str, Any], error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        RayReplayBuffer(**kwargs)


def test_prioritized_sampling_and_priority_updates_work_remotely() -> None:
    local = ReplayBuffer(
        storage=LazyTensorStorage(10), sampler=PrioritizedSampler(10, alpha=1.0, beta=1.0)
    )
    with RayReplayBuffer(
        storage=LazyTensorStorage(10), sampler=PrioritizedSampler(10, alpha=1.0, beta=1.0)
    ) as rb:
        for buffer in (rb, local):
            buffer.extend(frames(4))
            buffer.update_priority(torch.arange(4), torch.tensor([0.0, 0.0, 1000.0, 0.0]))
        sample = rb.sample(16)
        assert sample["index"].tolist() == [2] * 16
        expected = local.sample(16)[keys.PRIORITY_WEIGHT]
        torch.testing.assert_close(sample[keys.PRIORITY_WEIGHT], expected)
        rb.update_priority(torch.tensor([2, 3]), torch.tensor([0.0, 1000.0]))
        assert rb.sample(16)["index"].tolist() == [3] * 16
        state = rb.state_dict()
        with pytest.raises(ValueError, match=r"priorities must be finite and >= 0, got \[-1.0\]"):
            rb.update_priority(torch.tensor([0]), torch.tensor([-1.0]))
    with RayReplayBuffer(
        storage=LazyTensorStorage(10), sampler=PrioritizedSampler(10, alpha=1.0, beta=1.0)
    ) as restored:
        restored.load_state_dict(state)
        assert restored.sample(8)["index"].tolist() == [3] * 8, "priorities travel in the state"


def test_a_process_outside_ray_extends_the_buffer_through_a_client() -> None:
    with RayReplayBuffer(storage=ListStorage(100)) as rb:
        process = multiprocessing.get_context("spawn").Process(
            target=extend_through, args=(rb.client(), 7)
        )
        process.start()
        process.join(60)
        assert process.exitcode == 0
        assert rb.write_count == 7


def test_two_actors_extend_the_buffer_while_the_driver_samples() -> None:
    rb = RayReplayBuffer(storage=LazyTensorStorage(1000), batch_size=16)
    with RayCollector(
        counting_env(5), num_collectors=2, frames_per_batch=20, total_frames=400, replay_buffer=rb
    ) as collector:
        # In the foreground, iteration has the actors write and yields None.
        assert collector.next() is None
        assert (collector.frames, rb.write_count) == (20, 20)
        collector.start()
        with collector.pause():
            held = rb.write_count
            time.sleep(0.3)
            assert rb.write_count == held, "no actor writes while paused"
        samples = 0
        while not collector.is_done:
            assert rb.sample()["observation"].shape == (16, 1)
            samples += 1
        collector.async_shutdown()
        assert collector.frames == 400
        assert collector.state_dict()["frames"] == 400, "the final state still answers"
    assert samples > 0
    assert rb.write_count == 400, "write_count equals the frames collected"
    stored = rb[torch.arange(400)]
    ids = stored[keys.TRAJ_IDS]
    assert set((ids % 2).tolist()) == {0, 1}, "both actors wrote"
    counts = stored["next", "observation"][:, 0]
    assert set(counts.tolist()) == {1.0, 2.0, 3.0, 4.0, 5.0}
    rb.close()


def test_a_ray_collector_refuses_a_buffer_it_cannot_reach() -> None:
    with pytest.raises(TypeError, match=r"Use rlcollect.replay.RayReplayBuffer"):
        RayCollector(
            counting_env(),
            num_collectors=1,
            frames_per_batch=8,
            replay_buffer=ReplayBuffer(storage=LazyTensorStorage(10)),
        )

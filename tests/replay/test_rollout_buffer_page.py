"""The RolloutBuffer reference page (shared/reference/rollout-buffer.txt): its usage example runs
as printed, each method it lists does what it says, and its fields hold what it promises.

The env counts steps (`CountingEnv`) and the actor-critic is a known function of the
observation, so every field of every slot is predictable.
"""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from rlcollect import Collector
from rlcollect.errors import MisuseError
from rlcollect.replay import RolloutBuffer, iterate_minibatches, transition_view
from rlcollect.testing import CountingEnv

N, T = 4, 16
OBS_DIM, ACTION_DIM = 1, 1


class CountingActorCritic(nn.Module):
    """Action 0; `sample_log_prob = 1000 * env + observation` (unique per transition while
    episodes are longer than a rollout); `state_value = 2 * observation + 1`."""

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, ...]:
        count = observation[..., 0]
        env_index = torch.arange(count.shape[0], dtype=count.dtype)
        action = torch.zeros(count.shape, dtype=torch.int64)
        return action, 1000 * env_index + count, 2 * observation + 1


def actor_critic() -> TensorDictModule:
    return TensorDictModule(
        CountingActorCritic(),
        in_keys=["observation"],
        out_keys=["action", "sample_log_prob", "state_value"],
    )


def counting_collector(episode_length: int = 100, **options: object) -> Collector:
    env = CountingEnv(episode_length=episode_length, batch_size=(N,))
    return Collector(env, actor_critic(), frames_per_batch=N * T, **options)


def expected_log_probs(first_step: int = 0) -> list[float]:
    return sorted(1000.0 * n + t for n in range(N) for t in range(first_step, first_step + T))


# --- the usage example, as printed ---


def test_the_page_s_usage_example_runs_as_printed_and_every_transition_is_trained_on() -> None:
    num_envs, rollout_len, obs_dim, action_dim, device = N, T, OBS_DIM, ACTION_DIM, "cpu"
    batch_size = 12  # does not divide N * T: the last minibatch is smaller
    collector = counting_collector()
    seen = []

    buffer = RolloutBuffer(num_envs, rollout_len, obs_dim, action_dim, device)
    rollout = collector.collect(num_steps=rollout_len, rollout=buffer.start_rollout())
    buffer.add(rollout)

    rollout = buffer.get(flatten=False)
    flat_rollout = transition_view(rollout, flatten=True)
    for batch in iterate_minibatches(flat_rollout, batch_size, device):
        # batch["obs"], batch["action"], batch["advantage"] ...
        seen.append(batch)

    assert sum(len(batch) for batch in seen) == N * T == 64
    drawn = torch.cat([batch["sample_log_prob"] for batch in seen])
    assert sorted(drawn.tolist()) == expected_log_probs(), "each transition exactly once"
    assert [len(batch) for batch in seen] == [12] * 5 + [4]
    assert set(seen[0].keys()) >= {"obs", "action", "sample_log_prob", "value", "reward"}


# --- one test per method the page lists ---


def test_start_rollout_returns_the_shared_preallocated_rollout() -> None:
    buffer = RolloutBuffer(N, T, OBS_DIM, ACTION_DIM)
    rollout = buffer.start_rollout()
    assert rollout is buffer.rollout
    assert rollout.batch_size == (N, T + 1)
    assert rollout.names == [None, "time"]
    pointers = {key: leaf.data_ptr() for key, leaf in rollout.items()}
    counting_collector().collect(num_steps=T, rollout=rollout)
    buffer.add(rollout)
    buffer.get()
    again = buffer.start_rollout()
    assert again is rollout
    assert {key: leaf.data_ptr() for key, leaf in again.items()} == pointers, "written in place"


def test_add_marks_the_rollout_ready_for_one_get() -> None:
    buffer = RolloutBuffer(N, T, OBS_DIM, ACTION_DIM)
    with pytest.raises(MisuseError, match="no rollout is ready"):
        buffer.get()
    buffer.add(buffer.start_rollout())
    assert buffer.is_ready
    buffer.get(flatten=False)
    assert not buffer.is_ready
    with pytest.raises(MisuseError, match=r"call add\(\) first"):
        buffer.get()


def test_get_flatten_true_returns_the_n_times_t_transitions() -> None:
    buffer = RolloutBuffer(N, T, OBS_DIM, ACTION_DIM)
    rollout = counting_collector().collect(num_steps=T, rollout=buffer.start_rollout())
    buffer.add(rollout)
    flat = buffer.get(flatten=True)
    assert flat.batch_size == (N * T,)
    assert sorted(flat["sample_log_prob"].tolist()) == expected_log_probs()
    assert flat["obs"].shape == (N * T, OBS_DIM)


def test_get_flatten_false_returns_the_rollout_with_its_last_slot() -> None:
    buffer = RolloutBuffer(N, T, OBS_DIM, ACTION_DIM)
    rollout = counting_collector().collect(num_steps=T, rollout=buffer.start_rollout())
    buffer.add(rollout)
    got = buffer.get(flatten=False)
    assert got is buffer.rollout
    assert got.batch_size == (N, T + 1)
    assert got["obs"][:, T, 0].tolist() == [float(T)] * N  # the last observation is there


@pytest.mark.parametrize("flatten", [False, True])
def test_transition_view_drops_only_the_padded_last_slot(flatten: bool) -> None:
    buffer = RolloutBuffer(N, T, OBS_DIM, ACTION_DIM)
    rollout = counting_collector().collect(num_steps=T, rollout=buffer.start_rollout())
    view = transition_view(rollout, flatten=flatten)
    assert view.batch_size == ((N * T,) if flatten else (N, T))
    assert sorted(view["sample_log_prob"].reshape(-1).tolist()) == expected_log_probs()
    if not flatten:  # a view: writing to it writes to the rollout
        view["reward"][1, 2] = 7.0
        assert rollout["reward"][1, 2] == 7.0


def test_iterate_minibatches_puts_every_transition_in_one_minibatch_per_epoch() -> None:
    buffer = RolloutBuffer(N, T, OBS_DIM, ACTION_DIM)
    rollout = counting_collector().collect(num_steps=T, rollout=buffer.start_rollout())
    flat = transition_view(rollout, flatten=True)
    generator = torch.Generator().manual_seed(0)
    orders = []
    for _ in range(3):
        batches = list(iterate_minibatches(flat, 20, "cpu", generator=generator))
        assert [len(batch) for batch in batches] == [20, 20, 20, 4]
        drawn = torch.cat([batch["sample_log_prob"] for batch in batches])
        assert sorted(drawn.tolist()) == expected_log_probs()
        orders.append(drawn)
    assert not torch.equal(orders[0], orders[1]), "shuffled anew every epoch"


# --- the fields ---

FIELDS = {
    "obs": ((N, T + 1, OBS_DIM), torch.float32),
    "action": ((N, T + 1, ACTION_DIM), torch.float32),
    "sample_log_prob": ((N, T + 1), torch.float32),
    "value": ((N, T + 1), torch.float32),
    "reward": ((N, T + 1), torch.float32),
    "done": ((N, T + 1), torch.bool),
    "terminated": ((N, T + 1), torch.bool),
    "truncated": ((N, T + 1), torch.bool),
}


@pytest.mark.parametrize(("name", "shape_and_dtype"), FIELDS.items(), ids=list(FIELDS))
def test_fields_have_the_page_s_shapes_and_dtypes_before_and_after_a_collect(
    name: str, shape_and_dtype: tuple[tuple[int, ...], torch.dtype]
) -> None:
    buffer = RolloutBuffer(N, T, OBS_DIM, ACTION_DIM)
    rollout = buffer.start_rollout()
    shape, dtype = shape_and_dtype
    assert (rollout[name].shape, rollout[name].dtype) == (shape, dtype)
    counting_collector().collect(num_steps=T, rollout=rollout)
    assert (rollout[name].shape, rollout[name].dtype) == (shape, dtype)


def test_collected_fields_hold_the_steps() -> None:
    rollout = RolloutBuffer(N, T, OBS_DIM, ACTION_DIM).start_rollout()
    counting_collector(episode_length=5).collect(num_steps=T, rollout=rollout)
    steps = (torch.arange(T + 1) % 5).float().expand(N, T + 1)
    assert torch.equal(rollout["obs"][..., 0], steps)
    assert torch.equal(rollout["value"], 2 * steps + 1)
    assert torch.equal(rollout["reward"][:, :T], torch.ones(N, T))
    ends = steps[:, :T] == 4
    assert torch.equal(rollout["done"][:, :T], ends)
    assert torch.equal(rollout["terminated"][:, :T], ends)
    assert not rollout["truncated"].any()
    assert not rollout["action"].any()  # the discrete action 0, stored as a float


def test_value_in_the_last_slot_is_the_bootstrap_value_of_the_last_observation() -> None:
    buffer = RolloutBuffer(N, T, OBS_DIM, ACTION_DIM)
    rollout = counting_collector().collect(num_steps=T, rollout=buffer.start_rollout())
    last = rollout["obs"][:, -1]
    assert last[:, 0].tolist() == [float(T)] * N
    assert torch.equal(rollout["value"][:, -1], CountingActorCritic()(last)[2][:, 0])


def test_the_next_rollout_starts_from_the_last_observation() -> None:
    buffer = RolloutBuffer(N, T, OBS_DIM, ACTION_DIM)
    collector = counting_collector()
    rollout = collector.collect(num_steps=T, rollout=buffer.start_rollout())
    buffer.add(rollout)
    buffer.get()
    last = rollout["obs"][:, -1].clone()
    rollout = collector.collect(num_steps=T, rollout=buffer.start_rollout())
    assert torch.equal(rollout["obs"][:, 0], last)
    assert rollout["obs"][0, :, 0].tolist() == [float(T + t) for t in range(T + 1)]


def test_algorithm_fields_survive_the_next_collect() -> None:
    buffer = RolloutBuffer(N, T, OBS_DIM, ACTION_DIM)
    collector = counting_collector()
    rollout = collector.collect(num_steps=T, rollout=buffer.start_rollout())
    attached = {
        name: torch.rand(N, T + 1) for name in ("advantage", "return", "seq_return", "seq_mask")
    }
    rollout.update({name: value.clone() for name, value in attached.items()})
    buffer.add(rollout)
    buffer.get()
    collector.collect(num_steps=T, rollout=buffer.start_rollout())
    for name, value in attached.items():
        assert torch.equal(rollout[name], value), f"the collector overwrote {name!r}"
    assert rollout["obs"][0, 0, 0] == T, "while the collector's fields moved on"


def test_final_value_is_the_value_of_each_truncated_episode_s_last_observation() -> None:
    rollout = RolloutBuffer(N, T, OBS_DIM, ACTION_DIM).start_rollout()
    collector = counting_collector(max_frames_per_traj=3)  # truncated after 3 steps
    collector.collect(num_steps=T, rollout=rollout)
    truncated = rollout["truncated"][:, :T]
    assert torch.equal(truncated, (torch.arange(T) % 3 == 2).expand(N, T))
    assert not rollout["terminated"].any()
    # the last observation of every episode is 3 (obs[t + 1] is already the reset's 0)
    assert torch.equal(rollout["final_value"][:, :T], torch.where(truncated, 7.0, 0.0))
    assert torch.equal(rollout["obs"][:, 3, 0], torch.zeros(N))


def test_a_float_action_field_holds_a_discrete_env_s_actions() -> None:
    class Alternate(nn.Module):
        def forward(self, observation: torch.Tensor) -> torch.Tensor:
            return (observation[..., 0] % 2).long()

    policy = TensorDictModule(Alternate(), in_keys=["observation"], out_keys=["action"])
    env = CountingEnv(episode_length=100, batch_size=(N,))
    collector = Collector(env, policy, frames_per_batch=N * T)
    rollout = RolloutBuffer(N, T, OBS_DIM, ACTION_DIM).start_rollout()
    collector.collect(num_steps=T, rollout=rollout)
    assert rollout["action"][0, :T, 0].tolist() == [float(t % 2) for t in range(T)]
    assert not rollout["value"].any(), "no value head, no value written"


# --- misuse ---


def test_num_steps_must_match_the_rollout_and_the_collector() -> None:
    collector = counting_collector()
    with pytest.raises(ValueError, match=r"num_steps=8 but the rollout holds T=16 steps"):
        collector.collect(num_steps=8, rollout=RolloutBuffer(N, T, 1, 1).start_rollout())
    with pytest.raises(ValueError, match=r"num_steps=8 but this collector runs 16 steps per bat"):
        collector.collect(num_steps=8, rollout=RolloutBuffer(N, 8, 1, 1).start_rollout())
    with pytest.raises(ValueError, match=r"frames_per_batch=32"):
        collector.collect(num_steps=8, rollout=RolloutBuffer(N, 8, 1, 1).start_rollout())
    assert collector.frames == 0


def test_a_rollout_for_another_env_is_refused_naming_the_field() -> None:
    collector = counting_collector()
    rollout = RolloutBuffer(N, T, obs_dim=3, action_dim=1).start_rollout()
    with pytest.raises(ValueError, match=r"'obs' is \(4, 17, 3\).*obs_dim=1"):
        collector.collect(num_steps=T, rollout=rollout)
    assert not rollout["obs"].any(), "nothing written"


@pytest.mark.parametrize(
    ("arguments", "options", "message"),
    [
        ((N, T), {}, "needs obs_dim and action_dim"),
        ((N, T, 4), {}, "needs obs_dim and action_dim"),
        ((N, T, 4, 1), {"spec_or_example": RolloutBuffer.frame_example((4,), ())}, "either"),
    ],
)
def test_the_two_layouts_are_asked_for_unambiguously(
    arguments: tuple, options: dict, message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        RolloutBuffer(*arguments, **options)


@pytest.mark.parametrize("name", ["num_envs", "rollout_len", "obs_dim", "action_dim"])
def test_sizes_must_be_positive_ints(name: str) -> None:
    sizes = {"num_envs": N, "rollout_len": T, "obs_dim": 1, "action_dim": 1, name: 0}
    with pytest.raises(ValueError, match=f"{name} must be a positive int, got 0"):
        RolloutBuffer(**sizes)


# --- the TorchRL layout and devices ---


def test_the_torchrl_layout_takes_a_float_action_frame_and_gets_the_bootstrap_value() -> None:
    frame = RolloutBuffer.frame_example(observation_shape=(1,), action_shape=())
    assert frame["action"].dtype == torch.float32  # the env's action is an int64 index
    buffer = RolloutBuffer(N, T, spec_or_example=frame)
    collector = counting_collector()
    rollout = collector.collect(num_steps=T, rollout=buffer.start_rollout())
    assert rollout["action"].dtype == torch.float32
    assert rollout["observation"][0, :, 0].tolist() == [float(t) for t in range(T + 1)]
    assert torch.equal(rollout["state_value"][:, T], 2 * rollout["observation"][:, T] + 1)
    collector.collect_rollout(rollout)  # the same storage, without the bootstrap value
    assert rollout["observation"][0, 0, 0] == T


@pytest.mark.gpu
def test_a_rollout_on_cuda_is_filled_from_a_cpu_env() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    on_cpu = RolloutBuffer(N, T, OBS_DIM, ACTION_DIM).start_rollout()
    on_cuda = RolloutBuffer(N, T, OBS_DIM, ACTION_DIM, device="cuda").start_rollout()
    counting_collector(max_frames_per_traj=3).collect(num_steps=T, rollout=on_cpu)
    counting_collector(max_frames_per_traj=3).collect(num_steps=T, rollout=on_cuda)
    for name, field in on_cuda.items():
        assert field.is_cuda, name
        assert torch.equal(field.cpu(), on_cpu[name]), name


@pytest.mark.parametrize("flatten", [False, True])
def test_a_transition_view_cannot_be_taken_twice(flatten: bool) -> None:
    buffer = RolloutBuffer(N, T, OBS_DIM, ACTION_DIM)
    buffer.add(counting_collector().collect(num_steps=T, rollout=buffer.start_rollout()))
    view = transition_view(buffer.get(flatten=False), flatten=flatten)
    with pytest.raises(ValueError, match="it is already a transition view"):
        transition_view(view)
    with pytest.raises(ValueError, match="it is already a transition view"):
        transition_view(buffer.rollout.reshape(-1))  # a reshaped rollout has lost its time dim
    assert transition_view(buffer.rollout).batch_size == (N, T)

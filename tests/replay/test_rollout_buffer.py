"""RolloutBuffer: the preallocated [N, T+1] rollout, its transition view and minibatches."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rlcollect.errors import MisuseError
from rlcollect.replay import RolloutBuffer, iterate_minibatches, transition_view

N, T = 3, 5


def frame() -> TensorDict:
    return RolloutBuffer.frame_example(observation_shape=(4,), action_shape=(2,))


def fill(rollout: TensorDict, offset: float) -> None:
    """Writes a recognisable rollout: observation[n, t] = offset + 10 n + t."""
    steps = offset + 10 * torch.arange(N).unsqueeze(1) + torch.arange(T + 1)
    rollout["observation"][:] = steps.unsqueeze(-1)
    rollout["state_value"][:] = steps.unsqueeze(-1)
    rollout["next", "observation"][:, :T] = steps[:, 1:].unsqueeze(-1)
    rollout["next", "reward"][:, :T] = 1.0


def test_rollout_is_preallocated_zero_filled_and_named() -> None:
    buffer = RolloutBuffer(N, T, frame())
    rollout = buffer.start_rollout()
    assert rollout.batch_size == torch.Size([N, T + 1])
    assert rollout.names == [None, "time"]
    assert rollout["observation"].shape == torch.Size([N, T + 1, 4])
    assert rollout["next", "reward"].shape == torch.Size([N, T + 1, 1])
    assert rollout["collector", "traj_ids"].shape == torch.Size([N, T + 1])
    assert all((leaf == 0).all() for leaf in rollout.values(True, True))
    pointer = rollout["observation"].data_ptr()
    buffer.add(rollout)
    buffer.get()
    assert buffer.start_rollout()["observation"].data_ptr() == pointer


@pytest.mark.parametrize("shape", [(), (N, T), (N, T + 1), (7, 2)])
def test_examples_of_any_rollout_shape_give_per_frame_shapes(shape: tuple[int, ...]) -> None:
    example = frame().expand(*shape).clone() if shape else frame()
    rollout = RolloutBuffer(N, T, example).rollout
    assert rollout["action"].shape == torch.Size([N, T + 1, 2])


def test_a_spec_with_zero_describes_the_frame() -> None:
    class Spec:
        def zero(self) -> TensorDict:
            return TensorDict({"observation": torch.ones(3)}, [])

    assert RolloutBuffer(2, 4, Spec()).rollout["observation"].shape == torch.Size([2, 5, 3])


def test_last_observation_of_a_rollout_is_the_first_of_the_next() -> None:
    buffer = RolloutBuffer(N, T, frame())
    first = buffer.start_rollout()
    fill(first, offset=0.0)
    buffer.add(first)
    buffer.get()
    second = buffer.start_rollout()
    assert torch.equal(second["observation"][:, 0], first["observation"][:, T].clone())
    assert torch.equal(second["state_value"][:, 0, 0], 10.0 * torch.arange(N) + T)
    assert torch.equal(second["next", "observation"][:, 0, 0], 10.0 * torch.arange(N) + 1)


def test_get_returns_the_transition_view_once_per_add() -> None:
    buffer = RolloutBuffer(N, T, frame())
    with pytest.raises(MisuseError, match="no rollout is ready"):
        buffer.get()
    rollout = buffer.start_rollout()
    fill(rollout, offset=100.0)
    buffer.add(rollout)
    assert buffer.is_ready
    flat = buffer.get()
    assert flat.batch_size == torch.Size([N * T])
    assert flat["observation"][:, 0].tolist() == [
        100.0 + 10 * n + t for n in range(N) for t in range(T)
    ]
    with pytest.raises(MisuseError, match="call add\\(\\) first"):
        buffer.get()
    buffer.add(rollout)
    assert buffer.get(flatten=False) is buffer.rollout  # slot T included, as the page expects


def test_transition_view_shares_storage_with_the_buffer() -> None:
    buffer = RolloutBuffer(N, T, frame())
    rollout = buffer.start_rollout()
    view = transition_view(rollout)
    assert view.batch_size == torch.Size([N, T])
    assert view["observation"].data_ptr() == rollout["observation"].data_ptr()
    view["next", "reward"][1, 2] = 7.0
    assert rollout["next", "reward"][1, 2].item() == 7.0
    rollout["observation"][2, 4] = -3.0
    assert (view["observation"][2, 4] == -3.0).all()
    rollout["observation"][0, T] = 99.0  # slot T is not a transition
    assert not (view["observation"] == 99.0).any()
    single = RolloutBuffer(1, T, frame()).start_rollout()
    flat = RolloutBuffer.transition_view(single, flatten=True)
    flat["next", "reward"][3] = 5.0
    assert single["next", "reward"][0, 3].item() == 5.0


def test_slot_t_holds_the_bootstrap_value_outside_the_transitions() -> None:
    buffer = RolloutBuffer(N, T, frame())
    rollout = buffer.start_rollout()
    fill(rollout, offset=0.0)
    buffer.add(rollout)
    transitions = transition_view(buffer.get(flatten=False))
    steps = 10.0 * torch.arange(N).unsqueeze(1) + torch.arange(T + 1)
    assert torch.equal(transitions["state_value"][..., 0], steps[:, :T])
    assert torch.equal(buffer.rollout["state_value"][:, T, 0], steps[:, T])  # the bootstrap
    # the last transition's next observation is the observation stored in slot T
    assert torch.equal(
        transitions["next", "observation"][:, -1], buffer.rollout["observation"][:, T]
    )


def test_foreign_rollouts_are_copied_in_or_refused() -> None:
    buffer = RolloutBuffer(N, T, frame())
    other = buffer.rollout.clone()
    fill(other, offset=1.0)
    buffer.add(other)
    assert torch.equal(buffer.rollout["observation"], other["observation"])
    with pytest.raises(ValueError, match=r"expected a rollout of batch_size=\[3, 6\]"):
        buffer.add(other[:, :T])


def test_minibatches_cover_every_transition_once_per_epoch() -> None:
    buffer = RolloutBuffer(4, 10, frame())
    rollout = buffer.start_rollout()
    rollout["collector", "traj_ids"][:] = torch.arange(44).reshape(4, 11)
    buffer.add(rollout)
    transitions = transition_view(buffer.get(flatten=False))
    generator = torch.Generator().manual_seed(0)
    epochs = []
    for _ in range(2):
        batches = list(
            buffer.iterate_minibatches(transitions, 16, device="cpu", generator=generator)
        )
        assert [len(batch) for batch in batches] == [16, 16, 8]
        ids = torch.cat([batch["collector", "traj_ids"] for batch in batches])
        assert sorted(ids.tolist()) == sorted(
            transitions["collector", "traj_ids"].reshape(-1).tolist()
        )
        epochs.append(ids)
    assert not torch.equal(epochs[0], epochs[1])  # shuffled anew every epoch
    assert 10 not in epochs[0].tolist()  # slot T of env 0 is not a transition
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        next(iterate_minibatches(transitions, 0))


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ((0, T, frame()), ValueError, "num_envs must be a positive int"),
        ((N, -1, frame()), ValueError, "rollout_len must be a positive int"),
        ((N, T, torch.zeros(3)), TypeError, "spec_or_example must be a TensorDict"),
        ((N, T, frame().expand(4).clone()), ValueError, r"got batch_size=torch.Size\(\[4\]\)"),
    ],
)
def test_bad_arguments_are_refused(arguments: tuple, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        RolloutBuffer(*arguments)


@pytest.mark.gpu
def test_rollout_on_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    buffer = RolloutBuffer(N, T, frame(), device="cuda")
    rollout = buffer.start_rollout()
    assert rollout["observation"].is_cuda
    buffer.add(rollout)
    batch = next(iterate_minibatches(buffer.get(), 4, device="cpu"))
    assert batch["observation"].device.type == "cpu"

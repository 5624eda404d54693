"""`PettingZooAECEnv` on a real turn-based PettingZoo game (tic-tac-toe, with action masks)."""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule

from rlcollect import Collector
from rlcollect.envs import PettingZooAECEnv, PettingZooEnv, SerialEnv
from rlcollect.testing import check_env

pytest.importorskip("pettingzoo")
from pettingzoo.classic import tictactoe_v3

PLAYERS = ["player_1", "player_2"]


class FirstLegalMove(torch.nn.Module):
    """Each player plays its first legal square (deterministic)."""

    def forward(self, legal_1: torch.Tensor, legal_2: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return legal_1.float().argmax(-1), legal_2.float().argmax(-1)


def first_legal_move() -> TensorDictModule:
    return TensorDictModule(
        FirstLegalMove(),
        in_keys=[(player, "action_mask") for player in PLAYERS],
        out_keys=[(player, "action") for player in PLAYERS],
    )


def test_aec_env_passes_check_env() -> None:
    check_env(PettingZooAECEnv(tictactoe_v3.env(), seed=0))


def test_only_the_acting_agent_is_marked_and_its_moves_are_the_legal_ones() -> None:
    collector = Collector(
        PettingZooAECEnv(tictactoe_v3.env(), seed=3),
        first_legal_move(),
        frames_per_batch=30,
        total_frames=30,
    )
    batch = collector.next()
    collector.shutdown()
    acting = torch.cat([batch[player, "mask"] for player in PLAYERS], -1)  # [T, 2]
    assert bool((acting.sum(-1) == 1).all()), "exactly one agent acts at every step"
    # Replay the moves in PettingZoo's own loop: the marks and the legal moves agree.
    own = tictactoe_v3.env()
    own.reset(seed=3)
    own.reset()
    for t in range(batch.shape[0]):
        agent = own.agent_selection
        index = PLAYERS.index(agent)
        assert bool(acting[t, index]), t
        legal = torch.as_tensor(own.observe(agent)["action_mask"], dtype=torch.bool)
        assert torch.equal(batch[agent, "action_mask"][t, 0], legal), t
        other = PLAYERS[1 - index]
        assert bool(batch[other, "action_mask"][t].all()), "a waiting agent's mask is all True"
        own.step(int(batch[agent, "action"][t, 0]))
        rewards = torch.tensor([own.rewards[player] for player in PLAYERS])
        next_rewards = torch.cat([batch["next", p, "reward"][t].flatten() for p in PLAYERS])
        assert torch.equal(next_rewards, rewards), t
        if all(own.terminations.values()) or all(own.truncations.values()):
            assert bool(batch["next", "done"][t])
            own.reset()
    assert int(batch["next", "done"].sum()) >= 2


def test_same_batches_as_torchrls_aec_wrapper() -> None:
    torchrl_envs = pytest.importorskip("torchrl.envs")
    torchrl_collectors = pytest.importorskip("torchrl.collectors")
    from tests.collectors.single.torchrl_parity import assert_same_batches

    batches = []
    for collector_class, env in (
        (Collector, PettingZooAECEnv(tictactoe_v3.env(), seed=0)),
        (
            torchrl_collectors.Collector,
            torchrl_envs.PettingZooWrapper(tictactoe_v3.env(), seed=0, use_mask=True),
        ),
    ):
        collector = collector_class(env, first_legal_move(), frames_per_batch=12, total_frames=36)
        batches.append(list(collector))
        collector.shutdown()
    assert_same_batches(*batches)


def test_turn_based_steps_count_one_agent_step_each() -> None:
    collector = Collector(
        SerialEnv(2, lambda: PettingZooAECEnv(tictactoe_v3.env(), seed=0)),
        first_legal_move(),
        frames_per_batch=20,
        total_frames=20,
        count_steps_by="agent_steps",
    )
    batch = collector.next()
    collector.shutdown()
    assert batch.batch_size == (2, 10)  # one agent moves per step: 20 agent steps, 10 steps


def test_the_wrong_api_is_refused() -> None:
    with pytest.raises(TypeError, match=r"turn-based .* PettingZooAECEnv"):
        PettingZooEnv(tictactoe_v3.env())
    simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")  # the submodule itself
    with pytest.raises(TypeError, match=r"must be a PettingZoo AECEnv"):
        PettingZooAECEnv(simple_spread_v3.parallel_env())

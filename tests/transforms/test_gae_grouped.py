"""GAE on grouped (multi-agent) batches collected from PettingZoo's simple_spread, against
TorchRL's GAE; and the checks of `set_keys`."""

from __future__ import annotations

import functools

import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule
from torchrl.objectives.value import GAE as TorchRLGAE  # noqa: N811

from rlcollect import Collector
from rlcollect.envs import SerialEnv
from rlcollect.envs.pettingzoo_env import PettingZooEnv
from rlcollect.transforms.gae import GAE

pytest.importorskip("mpe2")
from mpe2 import simple_spread_v3

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

GROUP_KEYS = {
    "value": ("agents", "state_value"),
    "advantage": ("agents", "advantage"),
    "value_target": ("agents", "value_target"),
    "reward": ("agents", "reward"),
}
PER_AGENT_FLAGS = {"done": ("agents", "done"), "terminated": ("agents", "terminated")}


def spread_env(seed: int = 0) -> PettingZooEnv:
    env = simple_spread_v3.parallel_env(N=3, continuous_actions=False, max_cycles=10)
    return PettingZooEnv(env, group_map="all_in_one", seed=seed)


@functools.cache
def grouped_batch(num_envs: int) -> TensorDictBase:
    """80 frames of simple_spread (3 agents, 10-step episodes) under random actions."""
    env = spread_env() if num_envs == 1 else SerialEnv(num_envs, spread_env)
    collector = Collector(env, None, frames_per_batch=80, total_frames=80)
    batch = collector.next()
    collector.shutdown()
    return batch


def value_network() -> TensorDictModule:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(18, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    return TensorDictModule(net, [("agents", "observation")], [("agents", "state_value")])


def torchrl_gae(batch: TensorDictBase, average_gae: bool) -> TensorDictBase:
    """TorchRL's GAE as its MAPPO example runs it: env-level done expanded over the agents."""
    data = batch.clone()
    reward_shape = data["next", "agents", "reward"].shape
    for name in ("done", "terminated"):
        data["next", "agents", name] = data["next", name].unsqueeze(-1).expand(reward_shape)
    reference = TorchRLGAE(
        gamma=0.95, lmbda=0.9, value_network=value_network(), average_gae=average_gae
    )
    reference.set_keys(**GROUP_KEYS, **PER_AGENT_FLAGS)
    return reference(data)


@pytest.mark.parametrize("num_envs", [1, 2])
@pytest.mark.parametrize("flags", ["env_level", "per_agent"])
@pytest.mark.parametrize("average_gae", [False, True])
def test_grouped_gae_matches_torchrl(num_envs: int, flags: str, average_gae: bool) -> None:
    batch = grouped_batch(num_envs)
    assert int(batch["next", "done"].sum()) >= 2 * num_envs, "episodes end inside the batch"
    gae = GAE(0.95, 0.9, value_network(), average_gae=average_gae).set_keys(**GROUP_KEYS)
    if flags == "per_agent":
        gae.set_keys(**PER_AGENT_FLAGS)
    ours = gae(batch)
    reference = torchrl_gae(batch, average_gae)
    agent_keys = ["advantage", "value_target", "state_value", ("next", "agents", "state_value")]
    for key in agent_keys:
        full_key = (key[0], "agents", key[2]) if isinstance(key, tuple) else ("agents", key)
        assert ours[full_key].shape == (*batch.shape, 3, 1)
        torch.testing.assert_close(ours[full_key], reference[full_key])
    assert "advantage" not in batch["agents"], "the input batch is not modified"


def test_per_agent_flags_stop_each_agents_recursion_on_their_own() -> None:
    batch = grouped_batch(1).clone()
    agent_done = torch.zeros_like(batch["next", "agents", "done"])
    agent_done[4, 1] = True  # only agent 1 is done at step 4
    batch["next", "agents", "done"] = agent_done
    batch["next", "agents", "terminated"] = agent_done
    gae = GAE(0.9, 0.8, value_network()).set_keys(**GROUP_KEYS, **PER_AGENT_FLAGS)
    out = gae(batch)
    value, reward = out["agents", "state_value"], out["next", "agents", "reward"]
    torch.testing.assert_close(out["agents", "advantage"][4, 1], reward[4, 1] - value[4, 1])
    for agent in (0, 2):  # the others bootstrap through step 4
        assert not torch.allclose(out["agents", "advantage"][4, agent], reward[4, agent])


def test_grouped_values_already_in_the_batch_and_a_plain_module() -> None:
    batch = grouped_batch(2)
    net = value_network()
    with_values = GAE(0.95, 0.9, net).set_keys(**GROUP_KEYS)(batch)
    plain = GAE(0.95, 0.9, net.module).set_keys(**GROUP_KEYS, observation=("agents", "observation"))
    for out in (plain(batch), GAE(0.95, 0.9, None).set_keys(**GROUP_KEYS)(with_values)):
        torch.testing.assert_close(out["agents", "advantage"], with_values["agents", "advantage"])
    with pytest.raises(KeyError, match=r"lacks \[\('agents', 'state_value'\)"):
        GAE(0.95, 0.9, None).set_keys(**GROUP_KEYS)(batch)


def test_keys_given_as_lists_as_a_config_gives_them() -> None:
    gae = GAE(0.9, 0.9, None).set_keys(reward=["agents", "reward"], done=["done"])
    assert gae.keys.reward == ("agents", "reward")
    assert gae.keys.done == "done"


def small_group_batch() -> TensorDict:
    return TensorDict(
        {
            ("agents", "observation"): torch.randn(5, 3, 18),
            ("next", "agents", "observation"): torch.randn(5, 3, 18),
            ("next", "agents", "reward"): torch.randn(5, 3, 1),
            ("next", "done"): torch.zeros(5, 1, dtype=torch.bool),
        },
        batch_size=[5],
    )


@pytest.mark.parametrize(
    ("keys", "error", "message"),
    [
        ({"rewards": "r"}, TypeError, r"set_keys got unknown names \['rewards'\]; expected some"),
        ({"reward": 3}, TypeError, r"set_keys\(reward=3\): a key is a non-empty string"),
        ({"done": ("agents", "")}, TypeError, r"a key is a non-empty string or a tuple"),
        (
            {"value": "state_value"},
            ValueError,
            r"set_keys\(value='state_value'\): the value network writes \[\('agents', "
            r"'state_value'\)\]; pass one of them",
        ),
    ],
)
def test_bad_keys_are_rejected_naming_the_fix(keys: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        GAE(0.9, 0.9, value_network()).set_keys(**keys)


def test_a_missing_entry_names_the_entries_of_that_name() -> None:
    with pytest.raises(KeyError, match=r"GAE reads the reward at \('next', 'reward'\).*"):
        GAE(0.9, 0.9, value_network())(small_group_batch())
    with pytest.raises(KeyError, match=r"\('next', 'agents', 'reward'\)\]\); point GAE at yours"):
        GAE(0.9, 0.9, value_network())(small_group_batch())


def test_flags_that_do_not_fit_the_reward_are_reported() -> None:
    batch = small_group_batch()
    batch["next", "agents", "done"] = torch.zeros(5, 2, 1, dtype=torch.bool)
    gae = GAE(0.9, 0.9, value_network()).set_keys(**GROUP_KEYS, done=("agents", "done"))
    with pytest.raises(
        ValueError,
        match=r"the done flags at \('next', 'agents', 'done'\), shape \[5, 2, 1\], do not fit "
        r"the reward at \('next', 'agents', 'reward'\), shape \[5, 3, 1\]: expected env-level "
        r"flags \[5, 1\] or per-agent flags \[5, 3, 1\]",
    ):
        gae(batch)


def test_values_that_are_not_per_agent_are_reported() -> None:
    batch = small_group_batch()
    batch["next", "reward"] = torch.zeros(5, 1)
    with pytest.raises(ValueError, match=r"one value per reward, shape \[5, 1\]"):
        GAE(0.9, 0.9, value_network())(batch)

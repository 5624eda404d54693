"""`cudagraph_policy=True`: the policy really runs as a captured CUDA graph, and a captured
policy still draws fresh random numbers at every step.

Our path (`collectors/policy/acceleration.py`, `holder.py`): the TensorDict module is wrapped
once in `tensordict.nn.CudaGraphModule` and called through `DictStep`; after `warmup` (2)
eager calls it captures, then every step copies the inputs into the graph's buffers and
replays, so the module's Python `forward` no longer runs. Noise stays fresh: torch's default
CUDA generator registers with every capture, and each replay first advances the generator's
Philox offset by the graph's whole increment (ATen/cuda/CUDAGeneratorImpl.h), so replay k
draws what eager step k would. (A `torch.Generator` of the user's own would not be registered
by `CudaGraphModule`.) The CPU twins run the same bodies without a graph.
"""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import CudaGraphModule, TensorDictModule

from rlcollect import Collector
from rlcollect.envs import GymEnv
from tests.collectors.policies import bias_module
from tests.gpu.helpers import DEVICES, NoisyPolicy

pytestmark = pytest.mark.timeout(120)
FRAMES, BATCHES = 20, 5
# The probe call at construction, one eager warm-up call, then an eager call and the capture.
MOST_EAGER_CALLS = 4


def pendulum_collector(policy: object, device: str, **options: object) -> Collector:
    env = GymEnv("Pendulum-v1")
    env.set_seed(2)
    return Collector(
        env,
        policy,
        frames_per_batch=FRAMES,
        total_frames=FRAMES * BATCHES,
        policy_device=device,
        cudagraph_policy=device == "cuda",
        **options,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_the_graph_replays_and_draws_fresh_noise_at_every_step(device: str) -> None:
    noisy = TensorDictModule(NoisyPolicy(), in_keys=["observation"], out_keys=["action"])
    collector = pendulum_collector(noisy, device)
    try:
        running = collector.policy.module  # the copy on `device` that the steps run
        step = collector.loop.policy_step
        iterator = iter(collector)
        batches = [next(iterator)]
        calls_after_first = running.calls
        batches += list(iterator)
    finally:
        collector.shutdown()
    if device == "cuda":
        graph = collector.policy_holder.accelerated(collector.policy)
        assert isinstance(graph, CudaGraphModule)
        assert step._policy is graph  # every step goes through the graph
        assert 1 < calls_after_first <= MOST_EAGER_CALLS
        assert running.calls == calls_after_first, "a replay ran the module's Python forward"
    else:
        assert running.calls > FRAMES * BATCHES  # the twin: every step ran the forward
    actions = torch.cat([batch["action"] for batch in batches]).flatten()
    assert actions.numel() == FRAMES * BATCHES
    # Fresh noise: no step repeats another's draw (a replayed draw would repeat exactly).
    assert actions.unique().numel() == actions.numel()
    assert 0.05 < float(actions.std()) < 0.2


@pytest.mark.parametrize("device", DEVICES)
def test_the_graph_follows_weight_updates(device: str) -> None:
    """Weights are loaded in place into the module the graph captured: replays read them."""
    collector = pendulum_collector(bias_module(0.5), device)
    try:
        iterator = iter(collector)
        first, second = next(iterator), next(iterator)  # captured by now
        collector.update_policy_weights_(bias_module(1.25))
        third = next(iterator)
    finally:
        collector.shutdown()
    assert torch.all(first["action"] == 0.5)
    assert torch.all(second["action"] == 0.5)
    assert torch.all(third["action"] == 1.25)

"""`run_rollout`: the TensorDict-face rollout loop behind `EnvBase.rollout`."""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDictBase

from rlcollect import keys
from rlcollect.envs.protocol import EnvProtocol


def run_rollout(
    env: EnvProtocol,
    max_steps: int,
    policy: Callable[[TensorDictBase], TensorDictBase] | None,
    auto_reset: bool,
    break_when_any_done: bool,
    tensordict: TensorDictBase | None,
) -> TensorDictBase:
    """Step `env` up to `max_steps` times and stack the steps along a last dim named "time".

    `env` is any env of the TensorDict contract (`EnvProtocol`): this loop uses only `reset`,
    `rand_action`, `step`, `step_and_maybe_reset`, the key lists and `batch_size`.
    """
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1; got {max_steps}.")
    if auto_reset:
        root = env.reset()
    elif tensordict is None:
        raise ValueError("rollout(auto_reset=False) needs the starting `tensordict`.")
    else:
        root = tensordict
    steps = []
    for _ in range(max_steps):
        root = policy(root) if policy is not None else env.rand_action(root)
        if break_when_any_done:
            step = env.step(root)
            steps.append(step)
            if bool(step.get((keys.NEXT, keys.DONE)).any()):
                break
            root = step.get(keys.NEXT).select(*env.observation_keys, *env.done_keys).clone()
        else:
            step, root = env.step_and_maybe_reset(root)
            steps.append(step)
    data = torch.stack(steps, dim=len(env.batch_size))
    names = [*([None] * len(env.batch_size)), keys.TIME_DIM_NAME]
    data.refine_names(*names)  # type: ignore[attr-defined]
    return data

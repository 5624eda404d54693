"""The worker side of `ParallelEnv`: the sub-env's command set and the loop that serves it.

One worker process holds one sub-env bound to its slice of the shared-memory carrier. The
process, its pipes and the message format are `rlcollect.runtime.processes`'s; here the
header's argument is a time index or a seed. Step results never cross the pipe: they are in
shared memory.
"""

from __future__ import annotations

import enum
import pickle
import struct
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch

from rlcollect.envs.base import EnvBase
from rlcollect.runtime.payload import WorkerPayload
from rlcollect.runtime.processes import HEADER, OK, command_describer, error_reply, serve_commands

SEED_REPLY = struct.Struct("<q")


class Command(enum.IntEnum):
    """What the parent asks a worker to do; the header's argument is `t` or a seed."""

    STEP = 1
    ADVANCE = 2
    STEP_AND_ADVANCE = 3
    RESET = 4
    SEED = 5
    BIND = 6
    CLOSE = 7


# The env call a message stands for, e.g. `step_and_advance_into(t=3)`, for error messages.
describe_command = command_describer(
    Command,
    {Command.SEED: "set_seed({argument})", Command.BIND: "{name}", Command.CLOSE: "{name}"},
    default="{name}_into(t={argument})",
)


# --- worker process ---------------------------------------------------------------------------


def run_worker(index: int, connection: Connection, factory: WorkerPayload) -> None:
    """Serve one sub-env (the target `bootstrap` runs): build it, report its description,
    answer commands. A worker whose parent is gone (its pipe closed) closes its env and exits.
    """
    try:
        env = factory.load()()
        description = pickle.dumps(describe(env))
    except BaseException as err:  # sys.exit() in a factory is reported like any error
        connection.send_bytes(error_reply(err, "creating the sub-env"))
        return
    connection.send_bytes(OK + description)
    try:
        serve(env, connection)
    finally:
        env.close()


def describe(env: EnvBase) -> dict[str, Any]:
    """What the parent needs to know of the sub-env: batch size, device, specs and keys."""
    return {
        "batch_size": env.batch_size,
        "device": env.device,
        "observation_spec": env.observation_spec,
        "action_spec": env.action_spec,
        "reward_spec": env.reward_spec,
        "done_spec": env.done_spec,
        # Where actions, rewards and flags live (nested for some TorchRL envs), and one frame
        # with every key: the parent's carrier is made of it.
        "action_keys": list(env.action_keys),
        "reward_keys": list(env.reward_keys),
        "agents_per_step": env.agents_per_step,
        "group_map": env.group_map,
        "full_action_spec": env.full_action_spec,
        "frame": env.fake_tensordict(),
    }


def serve(env: EnvBase, connection: Connection) -> None:
    """Answer the parent's commands until `CLOSE` or until the parent's pipe closes."""
    hot: dict[int, Callable[[int], None]] = {
        Command.STEP_AND_ADVANCE: env.step_and_advance_into,
        Command.STEP: env.step_into,
        Command.ADVANCE: env.advance_into,
    }

    def handle(command: int, argument: int, message: bytes) -> bytes:
        call = hot.get(command)
        if call is not None:
            call(argument)
            return b""
        return run_control(env, command, argument, message[HEADER.size :])

    serve_commands(connection, handle, Command.CLOSE, describe_command, acknowledge_close=True)


def run_control(env: EnvBase, command: int, argument: int, payload: bytes) -> bytes:
    """Run one of the rare commands (reset, seed, bind); returns the reply payload."""
    if command == Command.RESET:
        mask = None
        if payload:
            flags = np.frombuffer(payload, dtype=np.bool_).copy()
            mask = torch.from_numpy(flags).reshape(env.batch_size)
        env.reset_into(argument, mask)
        return b""
    if command == Command.SEED:
        return SEED_REPLY.pack(env.set_seed(argument))
    if command == Command.BIND:
        env.bind(pickle.loads(payload))
        return b""
    raise ValueError(f"unknown command {command}; parent and worker versions differ.")

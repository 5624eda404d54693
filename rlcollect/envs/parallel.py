"""`ParallelEnv`: sub-envs in worker processes that write their steps into shared memory."""

from __future__ import annotations

import pickle
import weakref
from collections.abc import Sequence
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
from tensordict import TensorDictBase

from rlcollect.envs.base import EnvBase
from rlcollect.envs.parallel_worker import SEED_REPLY, Command, describe_command, run_worker
from rlcollect.envs.serial import CreateEnvFn, CreateEnvKwargs, env_factories
from rlcollect.envs.specs import batch_spec
from rlcollect.runtime.payload import WorkerPayload
from rlcollect.runtime.processes import (
    WorkerHandle,
    encode,
    shut_down_workers,
    worker_context,
)

# Seconds a closing worker gets before it is terminated.
CLOSE_TIMEOUT = 5.0


class ParallelEnv(EnvBase):
    """Runs `num_workers` sub-envs in worker processes, as one env of batch
    `[num_workers, *sub_batch]`.

    Buffer-first and zero-copy: `bind(carrier)` moves the carrier's env keys to shared memory
    in place (the caller's tensors keep working; NumPy views taken before `bind` do not, so take
    them after) and hands worker i its view `carrier[i]`. A step then costs one tiny message to
    each worker and one acknowledgement back; the results are already in the carrier.

    Start method: "forkserver" by default (where available, else "spawn"). Forking a parent that
    has started torch's thread pools can deadlock the child, and "spawn" re-imports torch in
    every worker (seconds each). The fork server is started once per process with this module
    preloaded, so each later worker is forked from a clean, torch-ready process in milliseconds.
    As with "spawn", a script that builds a `ParallelEnv` needs an `if __name__ == "__main__":`
    guard. `create_env_fn` travels with cloudpickle, so lambdas and closures work (and
    multiprocessing's shared objects it holds are shared: `rlcollect.runtime.payload`).

    Failures: an exception in a sub-env, or the death of a worker, raises
    `rlcollect.errors.WorkerError` in the parent (with the worker's traceback) and closes the
    env. `close()` stops every worker; it is idempotent and also runs when the env is garbage
    collected or the interpreter exits. Workers are daemonic, so a sub-env may not start
    processes of its own.

    Args:
        num_workers: the number of worker processes (one sub-env each).
        create_env_fn: a callable returning an env (an rlcollect or TorchRL env, or a
            `gymnasium.Env`), a Gymnasium id string, or a list of those (one per worker).
        create_env_kwargs: keyword arguments for `create_env_fn`, one mapping or one per worker.

    Keyword Args:
        mp_start_method: "forkserver", "spawn" or "fork"; None picks the default above.
        startup_timeout: seconds to wait for the workers to build their sub-envs.

    Examples:
        >>> env = ParallelEnv(2, "CartPole-v1")
        >>> env.set_seed(0)
        2
        >>> data = env.rollout(3, break_when_any_done=False)
        >>> data["next", "observation"].shape
        torch.Size([2, 3, 4])
        >>> env.close()
    """

    def __init__(
        self,
        num_workers: int,
        create_env_fn: CreateEnvFn,
        create_env_kwargs: CreateEnvKwargs = None,
        *,
        mp_start_method: str | None = None,
        startup_timeout: float = 300.0,
    ) -> None:
        factories = env_factories(num_workers, create_env_fn, create_env_kwargs)
        payloads = [WorkerPayload(factory, share_tensors=True) for factory in factories]
        context = worker_context(mp_start_method)
        self.num_workers = num_workers
        self._workers: list[WorkerHandle] = []
        self._finalizer = weakref.finalize(
            self, shut_down_workers, self._workers, encode(Command.CLOSE), CLOSE_TIMEOUT
        )
        try:
            for index, payload in enumerate(payloads):
                worker = WorkerHandle(
                    index,
                    context,
                    run_worker,
                    (payload,),
                    name=f"rlcollect-env-worker-{index}",
                    describe=describe_command,
                )
                self._workers.append(worker)
            description = self._await_descriptions(startup_timeout)
        except BaseException:
            self._finalizer()
            raise
        super().__init__(batch_size=(num_workers, *description["batch_size"]))
        for name in ("observation_spec", "action_spec", "reward_spec", "done_spec"):
            setattr(self, name, batch_spec(description[name], num_workers))
        self._action_keys = description["action_keys"]
        self._reward_keys = description["reward_keys"]
        self._agents_per_step = description["agents_per_step"]
        self._group_map = description["group_map"]
        self._full_action_spec = batch_spec(description["full_action_spec"], num_workers)
        frame = description["frame"]
        self._frame = frame.unsqueeze(0).expand(num_workers, *frame.batch_size).clone()
        self._sub_batch = description["batch_size"]
        self._handles = tuple(self._workers)

    def _await_descriptions(self, timeout: float) -> dict[str, Any]:
        descriptions = [pickle.loads(worker.receive(timeout)) for worker in self._workers]
        check_same_descriptions(descriptions)
        if descriptions[0]["device"].type != "cpu":
            raise ValueError(
                f"ParallelEnv shares CPU memory with its workers, but the sub-envs run on "
                f"{descriptions[0]['device']}; build CPU sub-envs and move the data afterwards."
            )
        return descriptions[0]

    @property
    def action_keys(self) -> list[Any]:
        return list(self._action_keys)

    @property
    def reward_keys(self) -> list[Any]:
        return list(self._reward_keys)

    @property
    def group_map(self) -> dict[str, list[str]]:
        return {group: list(agents) for group, agents in self._group_map.items()}

    @property
    def agents_per_step(self) -> int:
        return self._agents_per_step

    @property
    def full_action_spec(self) -> Any:
        return self._full_action_spec

    def fake_tensordict(self) -> TensorDictBase:
        """A zero-filled frame of the workers' sub-envs, stacked (nested keys kept as the
        sub-envs lay them out)."""
        return self._frame.clone()

    @property
    def worker_pids(self) -> list[int]:
        """The process ids of the workers (empty once closed)."""
        return [worker.process.pid for worker in self._workers]  # type: ignore[misc]

    # --- buffer face --------------------------------------------------------------------------

    def _bind(self, carrier: TensorDictBase) -> None:
        if carrier.device is not None and carrier.device.type != "cpu":
            raise ValueError(
                f"ParallelEnv needs a CPU carrier to share with its workers; got one on "
                f"{carrier.device}. Keep env_device='cpu' and set storing_device instead."
            )
        env_part = carrier.select(*self._frame.keys(include_nested=True, leaves_only=True))
        for tensor in env_part.values(include_nested=True, leaves_only=True):
            tensor.share_memory_()
        messages = [
            encode(Command.BIND, 0, bytes(ForkingPickler.dumps(env_part[index])))
            for index in range(self.num_workers)
        ]
        self._exchange(self._handles, messages)

    def reset_into(self, t: int, mask: torch.Tensor | None = None) -> None:
        if mask is None:
            self._broadcast(encode(Command.RESET, t))
            return
        per_env = mask.reshape(self.num_workers, -1)
        selected = per_env.any(dim=1).tolist()
        complete = per_env.all(dim=1).tolist()
        targets, messages = [], []
        for index, worker in enumerate(self._handles):
            if selected[index]:
                payload = b"" if complete[index] else per_env[index].numpy().tobytes()
                targets.append(worker)
                messages.append(encode(Command.RESET, t, payload))
        self._exchange(targets, messages)

    def step_into(self, t: int) -> None:
        self._broadcast(encode(Command.STEP, t))

    def advance_into(self, t: int) -> None:
        self._broadcast(encode(Command.ADVANCE, t))

    def step_and_advance_into(self, t: int) -> None:
        self._check_open()
        message = encode(Command.STEP_AND_ADVANCE, t)
        try:
            for worker in self._handles:
                worker.send(message)
            for worker in self._handles:
                worker.receive()
        except BaseException:
            # A failed or interrupted exchange leaves replies in flight: the env cannot go on.
            self.close()
            raise

    def _broadcast(self, message: bytes) -> None:
        self._exchange(self._handles, [message] * len(self._handles))

    def _exchange(self, workers: Sequence[WorkerHandle], messages: Sequence[bytes]) -> list[bytes]:
        """Send `messages[i]` to `workers[i]`, then collect every reply; close on failure."""
        self._check_open()
        try:
            for worker, message in zip(workers, messages, strict=True):
                worker.send(message)
            return [worker.receive() for worker in workers]
        except BaseException:
            self.close()
            raise

    # --- protocol -----------------------------------------------------------------------------

    def _set_seed(self, seed: int) -> int:
        # Chained as SerialEnv does: worker i + 1 gets the seed worker i returns. For our envs
        # that is `seed + i * sub-envs per worker`; TorchRL envs return seeds of their own.
        for handle in self._handles:
            (reply,) = self._exchange((handle,), [encode(Command.SEED, seed)])
            seed = SEED_REPLY.unpack(reply)[0]
        return seed

    def close(self) -> None:
        self._finalizer()
        self._handles = ()
        self._carrier = None
        self._views = None
        self._scratch = None
        super().close()

    def __repr__(self) -> str:
        return f"ParallelEnv(num_workers={self.num_workers}, batch_size={tuple(self.batch_size)})"


def check_same_descriptions(descriptions: list[dict[str, Any]]) -> None:
    """Raise a ValueError when a worker's sub-env differs from worker 0's in batch or specs."""
    reference = _comparable(descriptions[0])
    for index, full in enumerate(descriptions[1:], start=1):
        description = _comparable(full)
        if description != reference:
            raise ValueError(
                f"the sub-env of worker {index} ({description}) differs from worker 0's "
                f"({reference}); all sub-envs of a ParallelEnv must have the same batch and specs."
            )


def _comparable(description: dict[str, Any]) -> dict[str, Any]:
    """A description with its frame as `{key: (shape, dtype)}`, so that `==` compares it."""
    frame = description["frame"]
    layout = {
        key: (tuple(value.shape), value.dtype)
        for key, value in frame.items(include_nested=True, leaves_only=True)
    }
    return {**description, "frame": layout}

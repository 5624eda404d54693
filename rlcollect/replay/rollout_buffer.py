"""RolloutBuffer: a preallocated ``[N, T+1]`` on-policy rollout, its transitions, minibatches."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from rlcollect.batch.compact import transition_view
from rlcollect.errors import MisuseError
from rlcollect.keys import (
    ACTION,
    DONE,
    NEXT,
    OBSERVATION,
    REWARD,
    SAMPLE_LOG_PROB,
    STATE_VALUE,
    TERMINATED,
    TIME_DIM_NAME,
    TRAJ_IDS,
    TRUNCATED,
)


def iterate_minibatches(
    rollout: TensorDictBase,
    batch_size: int,
    device: torch.device | str | None = None,
    *,
    generator: torch.Generator | None = None,
) -> Iterator[TensorDictBase]:
    """Shuffles the transitions of ``rollout`` and yields them in minibatches (one epoch).

    Every transition is in exactly one minibatch; the last one is smaller when ``batch_size``
    does not divide their number.

    Args:
        rollout: transitions, e.g. ``transition_view(rollout)``; all batch dims are flattened.
        batch_size: transitions per minibatch.
        device: where minibatches are moved; ``None`` keeps them where they are.
        generator: the random generator of the shuffle.

    Examples:
        >>> data = TensorDict({"x": torch.arange(10)}, [10])
        >>> sizes = [len(batch) for batch in iterate_minibatches(data, 4)]
        >>> sizes
        [4, 4, 2]
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
    flat = rollout.reshape(-1) if rollout.batch_dims != 1 else rollout
    order = torch.randperm(flat.batch_size[0], generator=generator).to(flat.device or "cpu")
    for start in range(0, len(order), batch_size):
        batch = flat[order[start : start + batch_size]]
        yield batch if device is None else batch.to(device)


def _example_frame(spec_or_example: Any) -> TensorDictBase:
    example = spec_or_example
    if not isinstance(example, TensorDictBase) and callable(getattr(example, "zero", None)):
        example = example.zero()  # a composite spec
    if not isinstance(example, TensorDictBase):
        raise TypeError(
            "spec_or_example must be a TensorDict (one frame, or a [N, T] / [N, T + 1] rollout) "
            f"or a spec with a zero() method, got {type(spec_or_example).__name__}."
        )
    if example.batch_dims not in (0, 2):
        raise ValueError(
            f"the example must describe one frame (batch_size=[]) or a rollout "
            f"(batch_size=[N, T] or [N, T + 1]), got batch_size={example.batch_size}."
        )
    return example


class RolloutBuffer:
    """The storage of an on-policy rollout: ``N`` envs by ``T + 1`` steps, allocated once.

    The rollout is a TensorDict of batch ``[N, T + 1]`` (names ``[None, "time"]``) with the
    layout of a collector batch: root entries (``"observation"``, ``"action"``,
    ``"sample_log_prob"``, ``"state_value"``, the done flags, ``("collector", "traj_ids")``, ...)
    and a ``"next"`` sub-TensorDict (``("next", "observation")``, ``("next", "reward")``, the next
    done flags). For root entries slot ``T`` holds the last observation and its bootstrap value;
    for ``"next"`` entries it is padding. The last observation of one rollout is the first of the
    next: :meth:`start_rollout` copies root slot ``T`` to slot 0 from the second rollout on.

    A collector fills :meth:`start_rollout`'s TensorDict in place, :meth:`add` marks it ready,
    :meth:`get` returns its transition view, and :meth:`iterate_minibatches` shuffles it into
    minibatches. Algorithms attach their own entries (advantages, returns) to the rollout.

    Args:
        num_envs: ``N``, the number of envs stepped together.
        rollout_len: ``T``, the number of steps per rollout.
        spec_or_example: what one frame holds: a TensorDict of batch size ``[]``, a rollout-shaped
            TensorDict (``[N, T]`` or ``[N, T + 1]``) whose per-frame shapes are used, or a
            composite spec (its ``zero()``). :meth:`frame_example` builds the usual one.
        device: where the rollout is allocated.

    Examples:
        >>> frame = RolloutBuffer.frame_example(observation_shape=(4,), action_shape=(2,))
        >>> buffer = RolloutBuffer(num_envs=8, rollout_len=128, spec_or_example=frame)
        >>> rollout = buffer.start_rollout()
        >>> rollout.batch_size, rollout.names
        (torch.Size([8, 129]), [None, 'time'])
        >>> rollout["next", "reward"][:, :128] = 1.0  # the collector writes the rollout
        >>> buffer.add(rollout)
        >>> buffer.get()["next", "reward"].shape
        torch.Size([1024, 1])
    """

    def __init__(
        self,
        num_envs: int,
        rollout_len: int,
        spec_or_example: Any,
        device: torch.device | str = "cpu",
    ) -> None:
        for name, value in (("num_envs", num_envs), ("rollout_len", rollout_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}.")
        example = _example_frame(spec_or_example)
        self.num_envs = num_envs
        self.rollout_len = rollout_len
        self.device = torch.device(device)
        frame_dims = example.batch_dims
        self._rollout = example.apply(
            lambda leaf: torch.zeros(
                (num_envs, rollout_len + 1, *leaf.shape[frame_dims:]),
                dtype=leaf.dtype,
                device=self.device,
            ),
            batch_size=[num_envs, rollout_len + 1],
            device=self.device,
        )
        self._rollout.names = [None, TIME_DIM_NAME]
        self._started = 0
        self._ready = False

    @staticmethod
    def frame_example(
        observation_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        *,
        action_dtype: torch.dtype = torch.float32,
    ) -> TensorDict:
        """One frame (batch size ``[]``) with the standard rollout entries, zero-filled."""

        def flags() -> dict[str, torch.Tensor]:
            return {key: torch.zeros(1, dtype=torch.bool) for key in (DONE, TERMINATED, TRUNCATED)}

        entries: dict[Any, Any] = {
            OBSERVATION: torch.zeros(observation_shape),
            ACTION: torch.zeros(action_shape, dtype=action_dtype),
            SAMPLE_LOG_PROB: torch.zeros(()),
            STATE_VALUE: torch.zeros(1),
            **flags(),
            TRAJ_IDS: torch.zeros((), dtype=torch.int64),
            NEXT: {OBSERVATION: torch.zeros(observation_shape), REWARD: torch.zeros(1), **flags()},
        }
        return TensorDict(
            entries,
            batch_size=[],
        )

    @property
    def rollout(self) -> TensorDict:
        """The preallocated ``[N, T + 1]`` rollout."""
        return self._rollout

    def start_rollout(self) -> TensorDict:
        """Hands out the rollout to fill in place.

        From the second call on, slot 0 of every root entry is first set to slot ``T`` of the
        previous rollout (its last observation, flags and bootstrap value).
        """
        if self._started:
            root = self._rollout.exclude(NEXT)
            root[:, 0] = root[:, self.rollout_len]
        self._started += 1
        self._ready = False
        return self._rollout

    def add(self, rollout: TensorDictBase) -> None:
        """Marks the rollout as filled; a TensorDict other than the buffer's own is copied in.

        Raises:
            ValueError: ``rollout`` has another batch size than ``[N, T + 1]``.
        """
        if rollout is not self._rollout:
            if rollout.batch_size != self._rollout.batch_size:
                raise ValueError(
                    f"expected a rollout of batch_size={list(self._rollout.batch_size)} "
                    f"([N, T + 1]), got {list(rollout.batch_size)}; fill the TensorDict of "
                    "start_rollout()."
                )
            self._rollout.update_(rollout)
        self._ready = True

    @property
    def is_ready(self) -> bool:
        """Whether a rollout was added and not consumed by :meth:`get` yet."""
        return self._ready

    def get(self, flatten: bool = True) -> TensorDictBase:
        """Consumes the added rollout and returns its transition view (``[N * T]`` or ``[N, T]``).

        The view already lacks slot ``T``: compute bootstrapped quantities (GAE) on
        :attr:`rollout`, whose slot ``T`` holds the bootstrap value, and do not call
        :func:`transition_view` again on what this returns (that would drop step ``T - 1``).

        Raises:
            MisuseError: no rollout was added since the last ``get``.
        """
        if not self._ready:
            raise MisuseError(
                "no rollout is ready; fill start_rollout()'s TensorDict and call add() first."
            )
        self._ready = False
        return transition_view(self._rollout, flatten=flatten)

    @staticmethod
    def transition_view(rollout: TensorDictBase, flatten: bool = False) -> TensorDictBase:
        """See :func:`transition_view`."""
        return transition_view(rollout, flatten=flatten)

    @staticmethod
    def iterate_minibatches(
        rollout: TensorDictBase,
        batch_size: int,
        device: torch.device | str | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> Iterator[TensorDictBase]:
        """See :func:`iterate_minibatches`."""
        return iterate_minibatches(rollout, batch_size, device, generator=generator)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_envs={self.num_envs}, rollout_len={self.rollout_len}, "
            f"keys={list(self._rollout.keys(True, True))}, device={self.device})"
        )

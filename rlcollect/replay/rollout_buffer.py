"""RolloutBuffer: a preallocated ``[N, T+1]`` on-policy rollout, its transitions, minibatches."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from rlcollect.batch.compact import transition_view
from rlcollect.batch.rollout_layout import (
    FIELDS,
    RolloutLayout,
    allocate_rollout,
    positive_size,
)
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
    is_int,
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

    One class, two layouts (``rlcollect/batch/rollout_layout.py``), both of batch
    ``[N, T + 1]`` named ``[None, "time"]``:

    * ``RolloutBuffer(num_envs, rollout_len, obs_dim, action_dim, device)``: the buffer layout
      of the RolloutBuffer reference page, flat fields ``obs`` ``[N, T + 1, obs_dim]``,
      ``action`` ``[N, T + 1, action_dim]``, ``sample_log_prob``, ``value``, ``reward``,
      ``final_value`` (float32) and ``done``, ``terminated``, ``truncated`` (bool), each
      ``[N, T + 1]``. Slot ``T`` of ``obs`` holds the last observation and of ``value`` its
      bootstrap value; for the transition-only fields it is padding. ``final_value`` is the
      value of the last observation of an episode truncated at that step (GAE bootstraps
      from it). A discrete action of ``n`` choices (one-hot or categorical) fits
      ``action_dim=1``, holding its index as a float as SB3 does, or ``action_dim=n``,
      holding its one-hot; the env receives its own encoding either way.
    * ``RolloutBuffer(num_envs, rollout_len, spec_or_example, device=...)``: the TorchRL
      layout, the keys of a collector batch: root entries (``"observation"``, ``"action"``,
      ``"state_value"``, flags, ...) and a ``"next"`` sub-TensorDict; for root entries slot
      ``T`` holds the last observation and its bootstrap value, for ``"next"`` entries it is
      padding.

    A collector fills :meth:`start_rollout`'s TensorDict in place
    (``collector.collect(num_steps=rollout_len, rollout=buffer.start_rollout())``),
    :meth:`add` marks it ready, :meth:`get` hands it out, :func:`transition_view` gives its
    ``T`` transitions and :func:`iterate_minibatches` shuffles them into minibatches.
    Algorithms attach their own fields (``advantage``, ``return``) to the rollout; the
    collector never writes them. The last observation of one rollout is the first of the
    next: :meth:`start_rollout` copies slot ``T`` to slot 0 from the second rollout on.

    Args:
        num_envs: ``N``, the number of envs stepped together.
        rollout_len: ``T``, the number of steps per rollout.
        obs_dim: the buffer layout's numbers per observation; or, for the TorchRL layout, what
            ``spec_or_example`` takes.
        action_dim: the buffer layout's numbers per action: for a discrete action of ``n``
            choices, 1 (its index) or ``n`` (its one-hot).
        device: where the rollout is allocated.

    Keyword Args:
        spec_or_example: the TorchRL layout, from one frame: a TensorDict of batch size
            ``[]``, a rollout-shaped TensorDict (``[N, T]`` or ``[N, T + 1]``) whose
            per-frame shapes are used, or a composite spec (its ``zero()``).
            :meth:`frame_example` builds the usual one.

    Raises:
        TypeError: neither or both of (``obs_dim``, ``action_dim``) and ``spec_or_example``.
        ValueError: a size that is not a positive int, naming it.

    Examples:
        >>> buffer = RolloutBuffer(8, 128, 4, 1)  # the buffer layout
        >>> rollout = buffer.start_rollout()
        >>> rollout["obs"].shape, rollout["value"].shape, rollout.names
        (torch.Size([8, 129, 4]), torch.Size([8, 129]), [None, 'time'])
        >>> rollout["reward"][:, :128] = 1.0  # the collector writes the rollout
        >>> buffer.add(rollout)
        >>> transition_view(buffer.get(flatten=False), flatten=True)["reward"].shape
        torch.Size([1024])

        The TorchRL layout:

        >>> frame = RolloutBuffer.frame_example(observation_shape=(4,), action_shape=(2,))
        >>> buffer = RolloutBuffer(num_envs=8, rollout_len=128, spec_or_example=frame)
        >>> buffer.start_rollout()["next", "reward"].shape
        torch.Size([8, 129, 1])
    """

    def __init__(
        self,
        num_envs: int,
        rollout_len: int,
        obs_dim: int | Any = None,
        action_dim: int | None = None,
        device: torch.device | str = "cpu",
        *,
        spec_or_example: Any = None,
    ) -> None:
        self.num_envs = positive_size("num_envs", num_envs)
        self.rollout_len = positive_size("rollout_len", rollout_len)
        self.device = torch.device(device)
        if spec_or_example is None and obs_dim is not None and not is_int(obs_dim):
            spec_or_example, obs_dim = obs_dim, None  # RolloutBuffer(N, T, frame)
        if spec_or_example is not None:
            if obs_dim is not None or action_dim is not None:
                raise TypeError(
                    "RolloutBuffer takes either obs_dim and action_dim (the buffer layout) or "
                    f"spec_or_example (the TorchRL layout), got obs_dim={obs_dim!r}, "
                    f"action_dim={action_dim!r} with a spec_or_example; pass the device by "
                    "keyword: RolloutBuffer(N, T, frame, device=...)."
                )
            self.layout = RolloutLayout.TORCHRL
            self._rollout = self._allocate_torchrl(spec_or_example)
        else:
            if obs_dim is None or action_dim is None:
                raise TypeError(
                    "RolloutBuffer needs obs_dim and action_dim (the buffer layout: "
                    "RolloutBuffer(num_envs, rollout_len, obs_dim, action_dim, device)) or "
                    f"spec_or_example (the TorchRL layout); got obs_dim={obs_dim!r}, "
                    f"action_dim={action_dim!r}."
                )
            self.layout = RolloutLayout.BUFFER
            self._rollout = allocate_rollout(
                self.num_envs, self.rollout_len, obs_dim, action_dim, self.device
            )
        self._started = 0
        self._ready = False

    def _allocate_torchrl(self, spec_or_example: Any) -> TensorDict:
        example = _example_frame(spec_or_example)
        frame_dims = example.batch_dims
        batch = [self.num_envs, self.rollout_len + 1]
        rollout = example.apply(
            lambda leaf: torch.zeros(
                (*batch, *leaf.shape[frame_dims:]), dtype=leaf.dtype, device=self.device
            ),
            batch_size=batch,
            device=self.device,
        )
        rollout.names = [None, TIME_DIM_NAME]
        return rollout

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
        """Returns the shared preallocated rollout, for a collector to write in place.

        From the second call on, slot 0 is first set to slot ``T`` of the previous rollout:
        the last observation and its bootstrap value (``obs`` and ``value``; every root entry
        in the TorchRL layout).
        """
        if self._started:
            last = self.rollout_len
            if self.layout is RolloutLayout.BUFFER:
                for rollout_field in FIELDS:
                    if rollout_field.holds_last_slot:
                        entry = self._rollout.get(rollout_field.name)
                        entry[:, 0] = entry[:, last]
            else:
                root = self._rollout.exclude(NEXT)
                root[:, 0] = root[:, last]
        self._started += 1
        self._ready = False
        return self._rollout

    def add(self, rollout: TensorDictBase) -> None:
        """Marks the rollout as full, ready for :meth:`get`; a TensorDict other than the
        buffer's own is copied in.

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
        """Consumes the added rollout.

        Args:
            flatten: True returns its transition view over the valid first ``T`` steps,
                flattened to ``[N * T]``, ready for :func:`iterate_minibatches`; False returns
                the ``[N, T + 1]`` rollout itself, slot ``T`` included (for GAE, which
                bootstraps from it): take its transitions with
                ``transition_view(rollout, flatten=...)``.

        Raises:
            MisuseError: no rollout was added since the last ``get``.
        """
        if not self._ready:
            raise MisuseError(
                "no rollout is ready; fill start_rollout()'s TensorDict and call add() first."
            )
        self._ready = False
        return transition_view(self._rollout, flatten=True) if flatten else self._rollout

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
            f"layout={self.layout.value!r}, keys={list(self._rollout.keys(True, True))}, "
            f"device={self.device})"
        )

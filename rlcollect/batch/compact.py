"""The compact batch: every observation stored once, and `transition_view` back to transitions.

This is `store_obs_once=True`, ours; TorchRL's `compact_obs=True` (the `("next", obs)` entries
left out, the layout kept) is `rlcollect/batch/next_observations.py`.

A standard batch (DESIGN.md) stores each observation twice: at the root of step t + 1 and under
`"next"` of step t. `compact_batch` keeps it once, RLlib's way (an episode of T steps keeps T + 1
observations), and `transition_view` rebuilds the standard batch from it frame for frame.

Layout of a compact batch of `T` steps over an env batch `B` (the standard batch is
`[*B, T]`, last dim "time"); its batch size is `[*B]`, one row per env, and time is the first
dim of every leaf after `B`:

* observation keys (`"observation"`, ...): `[*B, T + 1, ...]`. Slot t < T is what the policy
  saw at step t; slot T is the observation after the last step (the standard batch's last
  `("next", obs)`, the bootstrap observation).
* every other entry, as in the standard batch: `"action"` and the policy's outputs, the flags,
  `("next", "reward")`, `("next", "done")`, ..., `("collector", "traj_ids")`: `[*B, T, ...]`.
  Sub-TensorDicts (`"next"`, `"collector"`) have batch size `[*B]` too; a group with more batch
  dims (a multi-agent group, `[*B, T, n_agents]`) keeps its own, and its observations are not
  compacted.
* `("final", "step")`: `[*B, K]` int64, the steps t < T - 1 whose `("next", obs)` is not the
  root observation of step t + 1, in time order (the last step of an episode that ends inside
  the batch: the env was reset after it); -1 pads the rows that have fewer than K.
* `("final", "next", <observation key>)`: `[*B, K, ...]`, those steps' `("next", obs)`: the
  final observations of the episodes that end inside the batch (zeros on padding).

The observation keys are the keys held both at the root and under `"next"` with the same shape
and dtype, the done flags excepted (`"observation"`, and e.g. `"step_count"` or a recurrent
state): what TorchRL's `compact_obs` drops from `"next"`, but nothing is lost. `K` is the
largest number of such steps in one row (usually 0 or 1 for episodes longer than the batch).
With the env batch as batch size, one TensorDict holds the `T + 1` observations, the `T` steps and
the `K` final observations of each env: indexing, stacking or moving it keeps them together, and
a shape that does not fit (stacking batches of different `K`) raises instead of mixing rows up.
`("final", "step")` marks a batch as compact.

Why the env batch as batch size: a TensorDict has one batch size, and `[*B, T]` can hold
neither `T + 1` observations nor a varying number of final ones (tensordict's `UnbatchedTensor`
could, but `stack` / `cat` silently keep one of them and `bytes()` fails on it). `[*B]` is
RLlib's view (per env, `T + 1` observations for `T` actions and rewards), and the TorchRL keys
keep their place and their per-step shape.

Which steps need their final observation is found by comparing the observations bit for bit,
not from the done flags, so compaction is lossless for any batch (batches gathered from worker
processes, split into trajectories, or rewritten by a `postproc` such as n-step returns).

Where it runs: `Collector(..., store_obs_once=True)` compacts straight from its carrier (each
observation is copied once, instead of twice for a standard batch); multi-process and Ray
collectors compact the gathered batch in the parent (a compact batch changes shape from batch to
batch, so it cannot live in a worker's shared-memory batch); `ReplayBuffer.extend` stores the
transitions of a compact batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDict, TensorDictBase

from rlcollect import keys
from rlcollect.batch.rollout_layout import is_buffer_layout

Key = tuple[str, ...]

_SAME_SIZE_INTEGER = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def is_compact(data: object) -> bool:
    """Whether `data` is a compact batch (it holds `("final", "step")`)."""
    return isinstance(data, TensorDictBase) and data.get(keys.FINAL_STEP, None) is not None


def _in_time_batch(batch: TensorDictBase, key: Key) -> bool:
    """Whether the entry at `key` sits in TensorDicts of the batch's own batch size (not in
    a group with more batch dims, such as a multi-agent group `[*B, T, n_agents]`)."""
    return all(
        batch.get(key[:depth]).batch_size == batch.batch_size for depth in range(1, len(key))
    )


def paired_observation_keys(batch: TensorDictBase) -> list[Key]:
    """The keys held at the root and under `"next"` as tensors of the same shape and dtype,
    the done flags excepted: the env's observations and state, which `compact_obs` leaves out
    of `"next"` and `store_obs_once` stores once."""
    next_entries = batch.get(keys.NEXT, None)
    if not isinstance(next_entries, TensorDictBase):
        return []
    found = []
    for key in next_entries.keys(include_nested=True, leaves_only=True):
        key = keys.as_tuple_key(key)
        if key[-1] in keys.DONE_KEYS:
            continue
        root, after = batch.get(key, None), next_entries.get(key)
        if (
            isinstance(root, torch.Tensor)
            and isinstance(after, torch.Tensor)
            and (root.shape, root.dtype) == (after.shape, after.dtype)
        ):
            found.append(key)
    return found


def compact_keys(batch: TensorDictBase) -> list[Key]:
    """The observation keys `compact_batch` stores once: `paired_observation_keys` outside
    groups with more batch dims than the batch (a multi-agent group's observations stay as
    they are)."""
    return [
        key
        for key in paired_observation_keys(batch)
        if _in_time_batch(batch, key) and _in_time_batch(batch, (keys.NEXT, *key))
    ]


def _sub_tensordicts(data: TensorDictBase, batch_size: torch.Size) -> list[TensorDictBase]:
    """The sub-TensorDicts of `data` of batch size `batch_size`, parents before children."""
    found = [
        (len(keys.as_tuple_key(key)), value)
        for key, value in data.items(include_nested=True)
        if isinstance(value, TensorDictBase) and value.batch_size == batch_size
    ]
    return [value for _, value in sorted(found, key=lambda pair: pair[0])]


def _drop_time(data: TensorDictBase) -> None:
    """`[*B, T]` -> `[*B]` for `data` and its sub-TensorDicts of its batch size."""
    time_batch = data.batch_size
    data.names = [None] * data.batch_dims
    data.batch_size = time_batch[:-1]
    for sub in _sub_tensordicts(data, time_batch):
        sub.batch_size = time_batch[:-1]


def _add_time(data: TensorDictBase, steps: int) -> None:
    """`[*B]` -> `[*B, steps]` for `data` and its sub-TensorDicts of its batch size."""
    env_batch = data.batch_size
    for sub in reversed(_sub_tensordicts(data, env_batch)):
        sub.batch_size = torch.Size([*env_batch, steps])
    data.batch_size = torch.Size([*env_batch, steps])
    data.names = [*([None] * len(env_batch)), keys.TIME_DIM_NAME]


def _words(frames: torch.Tensor, rows: int, steps: int) -> torch.Tensor:
    """`frames` (`[*B, steps, ...]`) as `[rows, steps, words]` integers, so that equality is
    bitwise (NaN, -0.0); as 8-byte words where the layout allows it (8x fewer to compare)."""
    if frames.is_complex():
        frames = torch.view_as_real(frames)
    frames = frames.reshape(rows, steps, frames.numel() // max(rows * steps, 1))
    if frames.dtype == torch.bool or frames.is_floating_point():
        frames = frames.view(_SAME_SIZE_INTEGER[frames.element_size()])
    try:
        return frames.view(torch.uint8).view(torch.int64)
    except RuntimeError:  # not contiguous per frame, or not a multiple of 8 bytes
        return frames


def _steps_apart(
    roots: Sequence[torch.Tensor],
    nexts: Sequence[torch.Tensor],
    rows: int,
    steps: int,
    dim: int,
    device: torch.device | None,
) -> torch.Tensor:
    """`[rows, steps - 1]` bool: where `("next", obs)` at t differs from the root obs at t + 1."""
    device = roots[0].device if roots else device
    apart = torch.zeros(rows, max(steps - 1, 0), dtype=torch.bool, device=device)
    if steps < 2:
        return apart
    for root, after in zip(roots, nexts, strict=True):
        later = _words(root.narrow(dim, 1, steps - 1), rows, steps - 1)
        before = _words(after.narrow(dim, 0, steps - 1), rows, steps - 1)
        apart |= (before != later).any(-1)
    return apart


def compact_batch(batch: TensorDictBase, *, copy: bool = False) -> TensorDictBase:
    """The compact form of a standard `[*B, T]` batch (see the module docstring).

    A compact batch is returned as it is. A batch without observations to compact (none under
    `"next"`, or only a multi-agent group's) still takes the compact layout, with nothing in
    `"final"` but `("final", "step")`, so that `transition_view` reads it the same way.

    Args:
        batch: a batch whose last dim is time.

    Keyword Args:
        copy: copy the entries kept as they are (needed when `batch` is a view of storage
            that will be overwritten); by default the compact batch shares them with `batch`.
            The observations are always new tensors.

    Raises:
        ValueError: `batch` has no batch dimension, or no step.

    Examples:
        >>> steps = torch.tensor([[0.0], [1.0], [0.0], [1.0]])  # an episode ends at step 1
        >>> batch = TensorDict(
        ...     {"observation": steps, "next": {"observation": steps + 1}}, batch_size=[4]
        ... )
        >>> compact = compact_batch(batch)
        >>> compact.batch_size, compact["observation"].squeeze(-1).tolist()
        (torch.Size([]), [0.0, 1.0, 0.0, 1.0, 2.0])
        >>> compact["final", "step"].tolist(), compact["final", "next", "observation"].tolist()
        ([1], [[2.0]])
        >>> transition_view(compact)["next", "observation"].squeeze(-1).tolist()
        [1.0, 2.0, 1.0, 2.0]
    """
    if is_compact(batch):
        return batch
    if batch.batch_dims == 0 or batch.batch_size[-1] == 0:
        raise ValueError(
            "compact_batch takes a batch whose last dim is time ([*env_batch, T], T >= 1); "
            f"got a TensorDict with batch_size={list(batch.batch_size)}."
        )
    observation_keys = compact_keys(batch)
    dim = batch.batch_dims - 1
    env_batch, steps = batch.batch_size[:-1], batch.batch_size[-1]
    rows = env_batch.numel()
    roots = [batch.get(key) for key in observation_keys]
    nexts = [batch.get((keys.NEXT, *key)) for key in observation_keys]
    apart = _steps_apart(roots, nexts, rows, steps, dim, batch.device)
    row, step = apart.nonzero(as_tuple=True)  # row-major: time order within a row
    counts = apart.sum(1)
    width = int(counts.max()) if row.numel() else 0
    rank = torch.arange(row.numel(), device=row.device) - (counts.cumsum(0) - counts)[row]
    final_steps = torch.full((rows, width), -1, dtype=torch.int64, device=apart.device)
    final_steps[row, rank] = step
    finals = TensorDict(batch_size=[*env_batch, width], device=batch.device)
    finals.set(keys.FINAL_STEP[1:], final_steps.reshape(*env_batch, width))
    rest = batch.exclude(*observation_keys, *((keys.NEXT, *key) for key in observation_keys))
    # A new tree (the original's sub-TensorDicts keep their batch size and names).
    rest = rest.clone() if copy else rest.copy()
    _drop_time(rest)
    for key, root, after in zip(observation_keys, roots, nexts, strict=True):
        rest.set(key, torch.cat([root, after.narrow(dim, steps - 1, 1)], dim))
        shape = after.shape[dim + 1 :]
        final = after.new_zeros(rows, width, *shape)
        final[row, rank] = after.reshape(rows, steps, *shape)[row, step]
        finals.set((keys.NEXT, *key), final.reshape(*env_batch, width, *shape))
    rest.set(keys.FINAL, finals)
    return rest


def _rollout_transitions(rollout: TensorDictBase) -> TensorDictBase:
    if rollout.batch_dims == 0 or rollout.batch_size[-1] < 1:
        raise ValueError(
            "transition_view takes a compact batch, or a rollout whose last batch dim is time "
            f"of length T + 1 >= 1; got batch_size={rollout.batch_size}."
        )
    view = rollout[..., : rollout.batch_size[-1] - 1]
    if is_buffer_layout(rollout):
        # A buffer-layout view loses the name "time", so that it cannot be taken twice.
        if rollout.names[-1] != keys.TIME_DIM_NAME:
            raise ValueError(
                "transition_view takes a RolloutBuffer rollout [N, T + 1] whose last dim is "
                f"named 'time'; this one has names={rollout.names}: it is already a transition "
                "view (another would drop step T - 1). Pass the rollout of "
                "buffer.get(flatten=False), or name its time dim."
            )
        view.names = [None] * view.batch_dims
    return view


def _steps(compact: TensorDictBase, rest: TensorDictBase, observation_keys: list[Key]) -> int:
    """T: one less than the observations' time dim, or the time dim of the other entries."""
    dim = compact.batch_dims
    if observation_keys:
        return compact.get(observation_keys[0]).shape[dim] - 1
    for value in rest.values(include_nested=True, leaves_only=True):
        if isinstance(value, torch.Tensor):
            return value.shape[dim]
    raise ValueError("a compact batch without any entry has no time dim to rebuild.")


def _from_compact(compact: TensorDictBase) -> TensorDictBase:
    env_batch = compact.batch_size
    dim = len(env_batch)
    finals = compact.get(keys.FINAL)
    final_next = finals.get(keys.NEXT, None)
    observation_keys = (
        [keys.as_tuple_key(key) for key in final_next.keys(True, True)]
        if final_next is not None
        else []
    )
    view = compact.exclude(keys.FINAL, *observation_keys).copy()  # a new tree, same leaves
    steps = _steps(compact, view, observation_keys)
    _add_time(view, steps)
    rows, width = env_batch.numel(), finals.batch_size[-1]
    final_steps = finals.get(keys.FINAL_STEP[1:]).reshape(rows, width)
    row, rank = (final_steps >= 0).nonzero(as_tuple=True)
    step = final_steps[row, rank]
    for key in observation_keys:
        observations = compact.get(key)
        view.set(key, observations.narrow(dim, 0, steps))
        after = observations.narrow(dim, 1, steps)
        if row.numel():  # a copy only where an episode ended inside the batch
            shape = after.shape[dim + 1 :]
            after = after.clone(memory_format=torch.contiguous_format)
            final = final_next.get(key).reshape(rows, width, *shape)
            after.view(rows, steps, *shape)[row, step] = final[row, rank]
        view.set((keys.NEXT, *key), after)
    return view


def transition_view(data: TensorDictBase, flatten: bool = False) -> TensorDictBase:
    """The transitions `[*B, T]` (the standard batch layout) of a compact batch or a rollout.

    * A compact batch (`Collector(..., store_obs_once=True)`, `compact_batch`) gives the standard
      batch it was made from, frame for frame. It shares the compact batch's tensors: root
      observations are views of its `[*B, T + 1]` ones, and so are the `("next", obs)` unless
      an episode ended inside the batch (then they are one copy with the final observations
      written in).
    * A `[*B, T + 1]` rollout (`RolloutBuffer`) gives its first `T` steps: slot `T` (the last
      observation and its bootstrap value, padding for `"next"` entries) is dropped. The result
      is a view: writing to it writes to the rollout, and the reverse. A rollout in the buffer
      layout (`obs`, `action`, ...) must have its time dim named "time", and its view has no
      name: a second `transition_view` of it is refused rather than dropping step `T - 1`.

    Args:
        data: a compact batch, or a TensorDict whose last batch dim is time, of length `T + 1`.
        flatten: merge the batch dims into one (`[N * T]`); a view when the layout allows it
            (e.g. `N == 1`), a copy otherwise.

    Raises:
        ValueError: `data` is neither a compact batch nor has a time dim of length >= 1.

    Examples:
        >>> rollout = TensorDict({"x": torch.arange(6).reshape(2, 3)}, [2, 3])
        >>> transition_view(rollout)["x"].tolist()
        [[0, 1], [3, 4]]
        >>> transition_view(rollout, flatten=True)["x"].tolist()
        [0, 1, 3, 4]
    """
    view = _from_compact(data) if is_compact(data) else _rollout_transitions(data)
    return view.reshape(-1) if flatten else view


class StoreObservationsOnce:
    """The batch post-processor of `store_obs_once=True`: `compact_batch` on every batch."""

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        return compact_batch(batch)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

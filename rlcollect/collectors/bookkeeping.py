"""Per-batch bookkeeping on small tensors: trajectory ids and finished-episode returns.

Both are computed once per batch from the done flags, with a handful of vectorised ops, so the
per-step loop does no bookkeeping at all.
"""

from __future__ import annotations

from collections import deque

import torch


def last_true_index(flags: torch.Tensor) -> torch.Tensor:
    """For `[n, T]` flags, the index of the last True at or before each step (-1 if none)."""
    steps = torch.arange(flags.shape[-1], device=flags.device).expand_as(flags)
    marked = torch.where(flags, steps, torch.full_like(steps, -1))
    return marked.cummax(dim=-1).values


class TrajectoryCounter:
    """Hands out trajectory ids, unique over the collector's life, as TorchRL's pool does.

    The `n` envs start with ids `0..n-1`; a sub-env done at step t gets the next id for step
    t+1, ids being handed out in step order and, within a step, in env order. A collector
    that is one of several workers draws from its own arithmetic progression `offset + k *
    stride` (worker i of W: offset i, stride W), so ids stay unique across workers and levels;
    `next_id` counts the ids taken, `k`.
    """

    def __init__(self, next_id: int = 0, offset: int = 0, stride: int = 1) -> None:
        self.next_id = next_id
        self.offset = offset
        self.stride = stride

    def take(self, count: int, device: torch.device) -> torch.Tensor:
        """`count` fresh ids."""
        ids = torch.arange(self.next_id, self.next_id + count, device=device)
        self.next_id += count
        if self.stride != 1 or self.offset:
            ids = ids * self.stride + self.offset
        return ids

    def fill(self, start_ids: torch.Tensor, done: torch.Tensor, out: torch.Tensor) -> None:
        """Write the ids of a batch into `out` (`[n, T + 1]`) from `done` (`[n, T]`).

        `out[:, 0]` is `start_ids`; `out[:, t + 1]` is the id after step t (a new one where the
        sub-env was done at step t). The last column is the carry for the next batch.
        """
        n, steps = done.shape
        time_major = done.t().reshape(-1)
        count = int(time_major.sum())
        out[:, 0] = start_ids
        if count == 0:
            out[:, 1:] = start_ids.unsqueeze(-1)
            return
        new_ids = torch.zeros(steps * n, dtype=out.dtype, device=out.device)
        new_ids[time_major] = self.take(count, out.device)
        new_ids = new_ids.reshape(steps, n).t()
        last = last_true_index(done)
        carried = new_ids.gather(1, last.clamp_min(0))
        out[:, 1:] = torch.where(last >= 0, carried, start_ids.unsqueeze(-1))


RECENT_EPISODES = 100


def finished_sums(
    running: torch.Tensor, values: torch.Tensor, done: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-episode sums of `[n, T]` `values` (rewards, or ones for lengths) given the sums
    carried over from earlier batches (`running`, `[n]`): the sums of the episodes that end in
    this batch, in done order, and the sums carried into the next batch."""
    cumulative = running.unsqueeze(-1) + values.cumsum(-1)
    previous = last_true_index(torch.nn.functional.pad(done[:, :-1], (1, 0), value=False))
    offset = torch.where(
        previous >= 0,
        cumulative.gather(1, (previous - 1).clamp_min(0)),
        torch.zeros_like(cumulative),
    )
    finished = (cumulative - offset)[done]
    last = last_true_index(done)[:, -1]
    end_offset = torch.where(
        last >= 0, cumulative.gather(1, last.clamp_min(0).unsqueeze(-1)).squeeze(-1), 0.0
    )
    return finished, cumulative[:, -1] - end_offset


class EpisodeTracker:
    """Sums rewards and steps per sub-env across batches and records the return and length of
    each finished episode.

    Keeps the returns of the last batch that finished any episode, and the returns and lengths
    of the last `RECENT_EPISODES` episodes: the smoothing window SB3's `ep_rew_mean` /
    `ep_len_mean` and RLlib use.
    """

    def __init__(self) -> None:
        self.running: torch.Tensor | None = None
        self.running_lengths: torch.Tensor | None = None
        self.episodes = 0
        self.last_returns: torch.Tensor = torch.zeros(0)
        self.recent_returns: deque[float] = deque(maxlen=RECENT_EPISODES)
        self.recent_lengths: deque[int] = deque(maxlen=RECENT_EPISODES)

    def restart(self) -> None:
        """Forget the unfinished episodes: the env was reset, they will never finish."""
        self.running = None
        self.running_lengths = None

    def restart_some(self, mask: torch.Tensor) -> None:
        """Forget the unfinished episodes of the sub-envs in `mask` (`[n]`), just reset."""
        for running in (self.running, self.running_lengths):
            if running is not None:
                running[mask.to(running.device)] = 0.0

    def update(self, reward: torch.Tensor, done: torch.Tensor) -> None:
        """Account one batch of `[n, T]` rewards and done flags."""
        reward = reward.double()
        if self.running is None or self.running.shape[0] != reward.shape[0]:
            self.running = torch.zeros(reward.shape[0], dtype=torch.float64, device=reward.device)
        if self.running_lengths is None or self.running_lengths.shape != self.running.shape:
            self.running_lengths = torch.zeros_like(self.running)
        episode_returns, self.running = finished_sums(self.running, reward, done)
        lengths, self.running_lengths = finished_sums(
            self.running_lengths, torch.ones_like(reward), done
        )
        if episode_returns.numel():
            self.last_returns = episode_returns.float().cpu()
            self.recent_returns.extend(self.last_returns.tolist())
            self.recent_lengths.extend(int(length) for length in lengths.round().tolist())
            self.episodes += int(episode_returns.numel())

    def state_dict(self) -> dict[str, object]:
        """The finished-episode statistics (unfinished episodes end with the env anyway)."""
        return {
            "episodes": self.episodes,
            "last_returns": self.last_returns.tolist(),
            "recent_returns": list(self.recent_returns),
            "recent_lengths": list(self.recent_lengths),
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore what `state_dict()` returned."""
        self.episodes = int(state["episodes"])  # type: ignore[call-overload]
        self.last_returns = torch.tensor(state["last_returns"], dtype=torch.float32)
        self.recent_returns.clear()
        self.recent_returns.extend(state["recent_returns"])  # type: ignore[arg-type]
        self.recent_lengths.clear()
        self.recent_lengths.extend(state.get("recent_lengths", []))  # type: ignore[arg-type]
        self.restart()

    @property
    def mean_return(self) -> float:
        """Mean return of the episodes finished in the most recent batch that finished any."""
        if self.last_returns.numel() == 0:
            return float("nan")
        return float(self.last_returns.mean())

    @property
    def recent_mean_return(self) -> float:
        """Mean return of the last `RECENT_EPISODES` finished episodes (NaN before the first)."""
        if not self.recent_returns:
            return float("nan")
        return sum(self.recent_returns) / len(self.recent_returns)

    @property
    def recent_mean_length(self) -> float:
        """Mean length (steps) of the last `RECENT_EPISODES` finished episodes (NaN before the
        first)."""
        if not self.recent_lengths:
            return float("nan")
        return sum(self.recent_lengths) / len(self.recent_lengths)

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
    this batch, in done order (env by env, then step by step), and the sums carried into the
    next batch. Works on the ends alone: a few ops on `[n, T]`, then on as many as ended."""
    steps = values.shape[-1]
    cumulative = running.unsqueeze(-1) + values.cumsum(-1)
    at = done.reshape(-1).nonzero().squeeze(-1)  # where episodes end, env-major
    at_end = cumulative.reshape(-1)[at]
    rows = torch.div(at, steps, rounding_mode="floor")
    # An episode starts after the end before it in its row, or at the batch's start.
    follows_an_end = torch.zeros_like(at, dtype=torch.bool)
    follows_an_end[1:] = rows[1:] == rows[:-1]
    start = torch.zeros_like(at_end)
    start[1:] = at_end[:-1]
    finished = at_end - torch.where(follows_an_end, start, torch.zeros_like(start))
    # What runs on into the next batch starts after the last end of each row.
    last_of_row = torch.ones_like(follows_an_end)
    last_of_row[:-1] = ~follows_an_end[1:]
    carried = cumulative[:, -1].clone()
    carried[rows[last_of_row]] -= at_end[last_of_row]
    return finished, carried


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
        n = reward.shape[0]
        if self.running is None or self.running.shape[0] != n:
            self.running = torch.zeros(n, dtype=torch.float64, device=reward.device)
        if self.running_lengths is None or self.running_lengths.shape != self.running.shape:
            self.running_lengths = torch.zeros_like(self.running)
        # Returns and lengths in one pass: rewards stacked over ones, the flags twice.
        sums, carried = finished_sums(
            torch.cat((self.running, self.running_lengths)),
            torch.cat((reward, torch.ones_like(reward))),
            torch.cat((done, done)),
        )
        finished = sums.numel() // 2
        episode_returns, lengths = sums[:finished], sums[finished:]
        self.running, self.running_lengths = carried[:n], carried[n:]
        if finished:
            self.last_returns = episode_returns.float().cpu()
            # Only the last RECENT_EPISODES can stay in the windows.
            self.recent_returns.extend(self.last_returns[-RECENT_EPISODES:].tolist())
            self.recent_lengths.extend(lengths[-RECENT_EPISODES:].round().long().tolist())
            self.episodes += finished

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

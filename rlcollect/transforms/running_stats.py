"""`RunningMeanStd`: the running mean and standard deviation of a stream of tensors."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class RunningMeanStd(nn.Module):
    """Mean and standard deviation of every element seen so far, per feature, in float64.

    Batches are merged with the parallel variance formula (Chan et al.), so the result does not
    depend on how the stream was cut. The state (`count`, `mean`, `m2`) is made of buffers.

    Args:
        eps: the smallest standard deviation returned.

    Examples:
        >>> stats = RunningMeanStd()
        >>> stats.update(torch.tensor([[1.0], [3.0]]), batch_dims=1)
        >>> stats.mean_std()
        (tensor([2.], dtype=torch.float64), tensor([1.4142], dtype=torch.float64))
    """

    count: torch.Tensor
    mean: torch.Tensor | None
    m2: torch.Tensor | None

    def __init__(self, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", None)
        self.register_buffer("m2", None)

    def update(self, value: torch.Tensor, batch_dims: int) -> None:
        """Add the `value.shape[:batch_dims]` samples of `value` (feature shape after them)."""
        samples = value.detach().reshape(-1, *value.shape[batch_dims:]).to(torch.float64)
        size = samples.shape[0]
        if size == 0:
            return
        batch_mean = samples.mean(0)
        batch_m2 = ((samples - batch_mean) ** 2).sum(0)
        if self.mean is None or self.m2 is None:
            self.mean = torch.zeros_like(batch_mean)
            self.m2 = torch.zeros_like(batch_m2)
        total = self.count + size
        delta = batch_mean - self.mean
        self.mean += delta * (size / total)
        self.m2 += batch_m2 + delta**2 * (self.count * size / total)
        self.count.fill_(total)

    def mean_std(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The current mean and standard deviation (0 and 1 until two samples were seen)."""
        if self.mean is None or self.m2 is None or self.count < 2:
            one = torch.ones((), dtype=torch.float64, device=self.count.device)
            return one * 0, one
        std = (self.m2 / (self.count - 1)).sqrt().clamp_min(self.eps)
        return self.mean, std

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        # mean and m2 are created by the first update; a fresh instance may load them.
        for name in ("mean", "m2"):
            if self._buffers[name] is None and prefix + name in state_dict:
                self._buffers[name] = torch.empty_like(state_dict[prefix + name])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

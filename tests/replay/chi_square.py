"""A chi-square goodness-of-fit check, without SciPy."""

from __future__ import annotations

from statistics import NormalDist

import torch


def chi_square(observed: torch.Tensor, probabilities: torch.Tensor) -> float:
    """Pearson's statistic of ``observed`` counts against the expected ``probabilities``."""
    expected = probabilities.double() * observed.sum()
    return float(((observed.double() - expected) ** 2 / expected).sum())


def chi_square_critical(degrees: int, significance: float = 1e-3) -> float:
    """The ``1 - significance`` quantile of chi-square (Wilson-Hilferty, close for df >= 10)."""
    z = NormalDist().inv_cdf(1.0 - significance)
    scale = 2.0 / (9.0 * degrees)
    return degrees * (1.0 - scale + z * scale**0.5) ** 3

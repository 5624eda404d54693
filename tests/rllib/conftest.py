"""The RLlib tests: real RLlib Algorithms and runners on the session's Ray cluster. Each module
skips, saying why, where the `rllib` extra (ray[rllib]) is not installed (`requires_rllib`)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _on_the_session_cluster(ray_cluster: str) -> None:
    """Every RLlib test runs on the session's Ray cluster (RLlib's Algorithms join it)."""

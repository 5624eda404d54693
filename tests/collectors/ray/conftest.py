"""The Ray tests: every one runs on the test run's one local Ray cluster (`ray_cluster`, from
tests/ray_session.py), started by the first Ray test and shut down at the end of the session, so
every Ray test pays for its actors only. Tests skip only when Ray is not installed.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _on_the_session_cluster(ray_cluster: str) -> None:
    """Every Ray test runs on the session's cluster (never one of its own)."""

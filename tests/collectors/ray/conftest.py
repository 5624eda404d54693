"""One local Ray cluster for the whole test session, and helpers for the Ray tests.

The cluster is small (2 CPUs, a 200 MB object store, no dashboard) and is started by the first
Ray test and shut down at the end of the session, so every Ray test pays for its actors only.
Tests skip only when Ray is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

CLUSTER_CPUS = 2
OBJECT_STORE_BYTES = 200 * 1024**2


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """The session's local cluster: its GCS address (for processes that join it)."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(
            num_cpus=CLUSTER_CPUS,
            object_store_memory=OBJECT_STORE_BYTES,
            include_dashboard=False,
            log_to_driver=False,
        )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        if started:
            ray.shutdown()


@pytest.fixture(autouse=True)
def _on_the_session_cluster(ray_cluster: str) -> None:
    """Every Ray test runs on the session's cluster (never one of its own)."""

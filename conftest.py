"""The test run's plugins, for every test path (tests/ and the doctests of rlcollect/)."""

from pathlib import Path

import pytest

pytest_plugins = ["tests.ray_session"]


def pytest_configure(config: pytest.Config) -> None:
    """TorchRL's workers, started beside ours as the reference, come from rlcollect's
    preloaded fork server too (tests/start_method.py)."""
    from tests.start_method import fork_server_by_default

    fork_server_by_default()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """rlcollect/rllib (its doctests) needs the `rllib` extra; without it, skip collecting it
    (tests/rllib skips itself, saying why)."""
    if not collection_path.is_relative_to(config.rootpath / "rlcollect" / "rllib"):
        return None
    try:
        import ray.rllib  # noqa: F401
    except ImportError:
        return True
    return None

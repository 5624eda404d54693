"""The test run's plugins, for every test path (tests/ and the doctests of rlcollect/)."""

pytest_plugins = ["tests.ray_session"]

"""One Ray cluster per test run: a pytest plugin (loaded by the root conftest.py).

Every test that uses Ray in a test process runs on the session's local cluster (`ray_cluster`,
started by the first such test, shut down after the last), and under pytest-xdist
they all go to one worker (`xdist_group("ray")`), so one cluster serves the whole run. A test
uses Ray when it asks for `ray_cluster` (every test under tests/collectors/ray does), or when
the code it runs as written names Ray (`import ray`, `RayCollector`, `RayReplayBuffer`, ...): a
doctest of rlcollect, a docs page's example block. A test may also run Ray in a subprocess of
its own that starts and stops its cluster. The session cluster's workers are forked from a
preloaded interpreter (tests/ray_zygote.py): an actor costs a fork, not an import of torch.

The guard: Ray names a cluster's session directory after the process that started it
(`<ray temp dir>/session_<date>_<pid>`). At the end of the run, every test process counts the
clusters it started itself, the xdist controller adds them up, and a run whose test processes
started more than one fails, naming them.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CLUSTER_CPUS = 2
OBJECT_STORE_BYTES = 200 * 1024**2
# Ray starts its workers (every actor) at nice 15: beside programs at nice 0 on a busy 2-core
# machine an actor then gets a few percent of a core, and building one (importing torch) took
# minutes, past every test's timeout. The tests check our code, not Ray's priorities.
SYSTEM_CONFIG = {"worker_niceness": 0}
# The same, for a subprocess that starts a cluster of its own (Ray reads RAY_<option>).
SUBPROCESS_ENV = {f"RAY_{option}": str(value) for option, value in SYSTEM_CONFIG.items()}
# The launcher and zygote of the session cluster's workers (named, not imported: the zygote
# imports torch).
ZYGOTE_MODULE = "tests.ray_zygote"
ZYGOTE_FILE = Path(__file__).resolve().parent / "ray_zygote.py"
# What code that uses Ray says.
USES_RAY = re.compile(
    r"\bimport ray\b|\bfrom ray\b|\bray\.init\("
    r"|\bRay(Collector|ReplayBuffer|Lease|WeightSyncScheme)\b"
)
# Where the counts travel from an xdist worker to the controller (`config.workeroutput`).
WORKER_OUTPUT_KEY = "ray_clusters_started"
_started_at = pytest.StashKey[float]()
_clusters = pytest.StashKey[list[str]]()
# The running cluster's clean-up, and how many of this run's tests that use it are still to run.
_cluster_stack = pytest.StashKey[contextlib.ExitStack]()
_cluster_tests_left = pytest.StashKey[int]()


@pytest.fixture(scope="session")
def ray_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The session's local cluster (2 CPUs, a 200 MB object store, no dashboard, workers at
    the tests' priority, forked from a preloaded zygote: tests/ray_zygote.py): its GCS address,
    for processes that join it. Tests skip only when Ray is not installed. It stops once the
    last test that uses it has run (`pytest_runtest_teardown`), not at the end of the run."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    with contextlib.ExitStack() as stack:
        request.config.stash[_cluster_stack] = stack
        if started:
            directory = tmp_path_factory.mktemp("ray-zygote")
            stack.enter_context(worker_zygote(str(directory / "socket")))
            with python_through_launcher(directory):
                ray.init(
                    num_cpus=CLUSTER_CPUS,
                    object_store_memory=OBJECT_STORE_BYTES,
                    include_dashboard=False,
                    log_to_driver=False,
                    _system_config=SYSTEM_CONFIG,
                )
            stack.callback(ray.shutdown)
        yield ray.get_runtime_context().gcs_address


@contextlib.contextmanager
def python_through_launcher(directory: Path) -> Iterator[None]:
    """While Ray starts a node, `sys.executable` names a launcher (tests/ray_zygote.py) in
    `directory`: the node's Python processes are started as `sys.executable <args>`, so the
    raylet starts its workers through the launcher, which has them forked from the zygote
    (and execs Python for the node's other processes). Ray's documented `py_executable`
    option does the same through a runtime env, but then every worker first runs Ray's
    `setup_worker.py`, which imports Ray: a second of CPU per actor."""
    launcher = directory / "python"
    launcher.write_text(
        f'#!/bin/sh\nexec "{sys.executable}" -S "{ZYGOTE_FILE}" "{directory / "socket"}" "$@"\n'
    )
    launcher.chmod(0o755)
    python, sys.executable = sys.executable, str(launcher)
    try:
        yield
    finally:
        sys.executable = python


@contextlib.contextmanager
def worker_zygote(socket_path: str) -> Iterator[None]:
    """The zygote the session cluster's workers are forked from, serving at `socket_path`
    until the cluster is shut down."""
    zygote = subprocess.Popen(
        [sys.executable, "-m", ZYGOTE_MODULE, "serve", socket_path],
        cwd=ZYGOTE_FILE.parents[1],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        if zygote.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
            raise RuntimeError(f"the Ray worker zygote did not start ({zygote.wait()})")
        yield
    finally:
        zygote.stdin.close()  # type: ignore[union-attr]
        try:
            zygote.wait(timeout=10)
        except subprocess.TimeoutExpired:
            zygote.kill()
            zygote.wait()


# --- which tests use Ray ---------------------------------------------------------------------


def code_run_by(item: pytest.Item) -> str:
    """The code a test runs as written: a doctest's examples, or a parametrized docs block's
    code (tests/test_docs.py); empty for other tests, which ask for `ray_cluster` instead."""
    test = getattr(item, "dtest", None)
    if test is not None:
        return "\n".join(example.source for example in test.examples)
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return ""
    return "\n".join(str(getattr(value, "code", "")) for value in callspec.params.values())


def uses_ray(item: pytest.Item) -> bool:
    """Whether `item` uses Ray: it asks for the session's cluster, or its code names Ray."""
    return "ray_cluster" in getattr(item, "fixturenames", ()) or bool(
        USES_RAY.search(code_run_by(item))
    )


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that uses Ray runs on the session's cluster, and, under xdist, in the one
    worker of the "ray" group."""
    grouped = config.pluginmanager.hasplugin("xdist")
    for item in items:
        if not uses_ray(item):
            continue
        names = getattr(item, "fixturenames", None)
        if names is not None and "ray_cluster" not in names:
            names.append("ray_cluster")  # set up before the test, like a requested fixture
        if grouped:
            item.add_marker(pytest.mark.xdist_group("ray"))


def pytest_collection_finish(session: pytest.Session) -> None:
    session.config.stash[_cluster_tests_left] = sum(
        "ray_cluster" in getattr(item, "fixturenames", ()) for item in session.items
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """Stop the cluster after the last test that uses it: under xdist one worker runs them
    all, one after the other, and later tests need the cores its daemons keep busy."""
    yield
    config = item.config
    if "ray_cluster" not in getattr(item, "fixturenames", ()):
        return
    config.stash[_cluster_tests_left] = config.stash.get(_cluster_tests_left, 1) - 1
    if config.stash[_cluster_tests_left] == 0 and _cluster_stack in config.stash:
        config.stash[_cluster_stack].close()


def group_names(item: pytest.Item) -> list[str]:
    """The xdist groups `item` is marked for (`xdist_group("name")` or `name=`)."""
    marks = item.iter_markers("xdist_group")
    return sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in marks})


class XdistGroups:
    """`--dist loadgroup` for pytest 9: xdist (3.8) sends a group's tests to one worker by the
    `@<group>` suffix it gives their node ids, written to `item._nodeid`; pytest 9 keeps a
    node's id in `item._id`, so the suffix is lost and every group's tests spread over every
    worker (each started a Ray cluster of its own). This puts the suffix where pytest 9 reads
    it, after xdist, for the tests that lack it."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        if not config.getvalue("loadgroup"):
            return
        for item in items:
            names = group_names(item)
            identifier = getattr(item, "_id", None)
            if not names or identifier is None or "@" in item.nodeid.rpartition("]")[2]:
                continue
            item._id = type(identifier).parse(f"{item.nodeid}@{'_'.join(names)}")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: where the tests are collected
        config.pluginmanager.register(XdistGroups(), "rlcollect-xdist-groups")


# --- the guard ---------------------------------------------------------------------------------


def ray_temp_dir() -> Path:
    """Where Ray keeps its session directories (RAY_TMPDIR, else the temp dir, then `ray`)."""
    return Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray"


def clusters_started_by(pid: int, since: float, root: Path | None = None) -> list[str]:
    """The session directories of the clusters process `pid` started since `since` (a
    `time.time()`): Ray names each after its starter's pid."""
    try:
        entries = list((root or ray_temp_dir()).glob(f"session_*_{pid}"))
    except OSError:
        return []
    found = []
    for entry in entries:
        try:
            if entry.is_dir() and not entry.is_symlink() and entry.stat().st_mtime >= since:
                found.append(entry.name)
        except OSError:
            continue
    return sorted(found)


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_started_at] = time.time() - 1.0  # directory times are coarse
    session.config.stash[_clusters] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """xdist controller: add what a worker's tests started."""
    config = node.config  # type: ignore[attr-defined]
    output = getattr(node, "workeroutput", {}) or {}
    config.stash[_clusters].extend(output.get(WORKER_OUTPUT_KEY, []))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Count the clusters this process started; a worker hands them to the controller, the
    process that reports the run fails it when its test processes started more than one."""
    config = session.config
    own = clusters_started_by(os.getpid(), config.stash[_started_at])
    worker_output = getattr(config, "workeroutput", None)
    if worker_output is not None:
        worker_output[WORKER_OUTPUT_KEY] = own
        return
    clusters = config.stash[_clusters]
    clusters.extend(own)
    if len(clusters) > 1:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    config = terminalreporter.config
    if hasattr(config, "workeroutput") or _clusters not in config.stash:
        return
    clusters = config.stash[_clusters]
    if len(clusters) > 1:
        terminalreporter.write_sep("=", "more than one Ray cluster", red=True)
        terminalreporter.write_line(
            f"the test processes started {len(clusters)} Ray clusters ({', '.join(clusters)}); "
            "a test that uses Ray must run on the session's cluster (the ray_cluster fixture) "
            "or in a subprocess of its own that stops its cluster."
        )

"""Shared fixtures: a real broker on an ephemeral port (never 5672), real clients, and the
scaffolding several test directories need (helpers themselves are in eb_support.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import pytest

from eb_support import (SubprocessBroker, close_quietly, create_pg_database, dispose_pg_admin,
                        drop_pg_database, pika_connect)
from exchange_broker.testing import ThreadedBroker

# `exchange-broker serve` started by tests must never take the admin API's default port, which is
# the RabbitMQ management port on these machines: off unless a test asks for its own (tests/admin).
os.environ["EXCHANGE_BROKER_ADMIN_PORT"] = "0"


def pytest_addoption(parser, pluginmanager):
    """pyproject's addopts run the suite on pytest-xdist workers (``-n``, ``--dist``). Without
    xdist (``-p no:xdist``, or not installed) those options are accepted and do nothing, so the
    same command runs the suite in one process."""
    if not pluginmanager.has_plugin("xdist"):
        group = parser.getgroup("xdist", "pytest-xdist is not active: these options are ignored")
        group.addoption("--numprocesses", dest="numprocesses", default=None)
        group.addoption("--dist", dest="dist", default="no")


# How the suite is spread over xdist workers (``--dist=loadscope``, pyproject's addopts): each
# test module is one unit of work, run on one worker (its module-scoped fixtures set up once), and
# these groups of modules are one unit each:
# - "cluster": the tests that kill, pause or cut off real cluster nodes and time their failovers
#   (tests/cluster/cluster_support.py: short heartbeats and failover timeout), and the cluster
#   benchmarks. Two of these tests side by side (6 node processes and their load on 2 cores) starve
#   nodes of CPU until they are evicted (seen with --dist=load: 11 of 29 failed), so the group is
#   one unit, on one worker. The tests of tests/cluster that start nodes but fail none over
#   (``UNGROUPED``) are ordinary units: their nodes get a failover timeout that no starving on a
#   busy machine reaches (``on_priority_worker``, tests/cluster/conftest.py).
# - "spark": every test that needs a Spark session (one JVM per worker that runs any: the
#   session-scoped ``spark`` fixture). Spread over the workers, three or four JVMs started and
#   warmed up side by side on 2 cores: the Spark tests took 841 s of worker time in a run
#   (2026-12-02) against 236 s in one process alone. As one unit they share one JVM.
# The cluster group is the first unit handed out, and its worker keeps the normal CPU priority
# while the other workers lower theirs (``PRIORITY_NICE``) for the rest of the run: when the CPU
# is short, the node processes (children of the cluster worker, or in their own session) get it
# before the other tests. The tests with a real-time budget elsewhere (``REALTIME``: a lateness, a
# time to close) join that unit for the same reason (they used to run alone, every other worker
# waiting: up to 50 s of the cluster worker's run went in those waits).
# The long units go out first (the cluster group, then ``LONG_UNITS``, then by number of tests):
# the run ends on short modules rather than on a long one started last.
# (pytest-xdist's own --dist=loadgroup cannot do this here: with pytest 9.2 it ignores the
# xdist_group marks, pytest-xdist issue #1386.)
SCOPE_GROUPS = {"tests/cluster/": "cluster", "tests/benchmarks/test_cluster": "cluster", "tests/spark/": "spark"}
# tests/cluster modules that fail no node over: in-process brokers and stores, and nodes that only
# serve (their own units, off the cluster group's serial path)
UNGROUPED = ("tests/cluster/test_remote_queue.py", "tests/cluster/test_connection_handoff.py",
             "tests/cluster/test_rejoin_placement.py", "tests/cluster/test_promotion_counts.py",
             "tests/cluster/test_cluster_store.py", "tests/cluster/test_cluster_leaders_store.py",
             "tests/cluster/test_queue_moves_store.py", "tests/cluster/test_db_lease.py",
             "tests/cluster/test_stale_guard.py", "tests/cluster/test_db_pair.py",
             "tests/cluster/test_leaders.py", "tests/cluster/test_queue_moves.py",
             "tests/cluster/test_mqtt_any_node.py", "tests/cluster/test_mqtt_takeover_nodes.py")
PRIORITY_GROUP = "cluster"
PRIORITY_NICE = 10  # CFS weight 110 against 1024 at nice 0
# the tests marked ``realtime``, which run in the priority group (checked at collection)
REALTIME = ("tests/core/test_connection.py::test_silent_client_is_dropped_after_missed_heartbeats",
            "tests/extensions/test_delayed.py::test_lateness_200_messages",
            "tests/extensions/test_delayed.py::test_restart_after_sigkill",
            "tests/persistence/test_store.py::test_load_definitions_fast_with_many_messages",
            "tests/compat/test_frame_limits.py::test_two_gigabyte_frame_header_during_the_handshake_is_closed_at_once")
# handed out right after the cluster group, in this order: the Spark group, then the longest single
# modules (xdist's own order, by number of tests, handed a one-test 80 s module out last, and the
# run ended on it), then other long ones
LONG_UNITS = ("spark", "tests/interop/test_java_client_suite.py", "tests/movers/test_shovel_restarts.py",
              "tests/security/test_fuzz.py", "tests/durability/")


def _scope_of(nodeid: str) -> str:
    """The unit of work of a test: its group, or its module (``tests/x/test_y.py``)."""
    if nodeid.startswith(REALTIME):
        return PRIORITY_GROUP
    path = nodeid.split("::", 1)[0]
    if path in UNGROUPED:
        return path
    return next((group for prefix, group in SCOPE_GROUPS.items() if path.startswith(prefix)), path)


def _hand_out_order(scope: str) -> int:
    if scope == PRIORITY_GROUP:
        return 0
    return 1 + next((i for i, prefix in enumerate(LONG_UNITS) if scope.startswith(prefix)), len(LONG_UNITS))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadscope":
        return None  # another --dist asked for on the command line: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class ModuleOrGroupScheduling(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return _scope_of(nodeid)

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the first unit handed out: the queue is complete
                self.ordered = True  # (xdist's own order, by number of tests, kept within a rank)
                units = sorted(self.workqueue.items(), key=lambda unit: _hand_out_order(unit[0]))
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return ModuleOrGroupScheduling(config, log)


_run_has_priority_group: list[bool] = []  # this worker collected tests of PRIORITY_GROUP


def pytest_collection_modifyitems(config, items):
    _run_has_priority_group.append(any(_scope_of(item.nodeid) == PRIORITY_GROUP for item in items))
    marked = {item.nodeid for item in items if item.get_closest_marker("realtime") is not None}
    listed = {item.nodeid for item in items if item.nodeid.startswith(REALTIME)}
    if marked != listed:  # the scheduler sees node ids only: REALTIME must name what is marked
        raise pytest.UsageError("tests/conftest.py: REALTIME must list exactly the tests marked realtime; "
                                f"marked only: {sorted(marked - listed)}, listed only: {sorted(listed - marked)}")


def _set_priority(item) -> None:
    """Once, at a worker's first test: a worker that does not start with the cluster group (the
    first unit handed out, so one worker has it) lowers its CPU priority, and its children's."""
    if "PYTEST_XDIST_WORKER" in os.environ and any(_run_has_priority_group) \
            and _scope_of(item.nodeid) != PRIORITY_GROUP:
        try:
            os.nice(PRIORITY_NICE)
        except OSError:  # not allowed here: the run goes on at equal priority
            pass


def _compile_sources() -> None:
    """The project's modules compiled to bytecode (``__pycache__``, ignored by git) once, up front:
    the suite starts hundreds of broker and CLI processes, and where PYTHONDONTWRITEBYTECODE is set
    each of them would otherwise compile every module of the broker again (about a quarter of a
    second of CPU per start). Python reads bytecode that exists whatever that variable says."""
    import compileall
    root = Path(__file__).resolve().parents[1]
    for package in ("exchange_broker", "persistence", "routing", "migrations", "spark_integration"):
        try:
            compileall.compile_dir(str(root / package), quiet=2)
        except OSError:  # a read-only checkout: the processes compile as before
            return


def _rewrite_tests_once(config) -> None:
    """Every test module and conftest rewritten for pytest's asserts once, by the controlling
    process, into pytest's own cache of rewritten modules (``__pycache__``, ignored by git), which
    the workers read. Where PYTHONDONTWRITEBYTECODE is set pytest writes no such cache, so each of
    the 4 workers rewrote all 214 files again at its start: 12 s of CPU each, half a minute of the
    run's wall time on 2 cores before the first test. Through pytest's own rewrite functions
    (private: if they change, the workers rewrite as before)."""
    try:
        from _pytest.assertion import rewrite
        state = config.stash[rewrite.assertstate_key]
        tail = rewrite.PYC_TAIL
        for fn in sorted(Path(__file__).resolve().parent.rglob("*.py")):
            if not (fn.name.startswith("test_") or fn.name == "conftest.py"):
                continue
            pyc = rewrite.get_cache_dir(fn) / (fn.name[:-3] + tail)
            if rewrite._read_pyc(fn, pyc) is None and rewrite.try_makedirs(pyc.parent):
                source_hash, code = rewrite._rewrite_test(fn, config)
                rewrite._write_pyc(state, code, source_hash, pyc)
    except (ImportError, AttributeError, KeyError, TypeError, OSError, SyntaxError):
        return


def pytest_configure(config):
    if hasattr(config, "workerinput"):  # an xdist worker
        return
    _compile_sources()  # the controlling process (or the only one), once
    if (config.pluginmanager.has_plugin("xdist") and config.getoption("numprocesses")
            and config.getoption("assertmode") == "rewrite"):
        _rewrite_tests_once(config)


_started: list = []  # this worker ran a test already


def pytest_runtest_setup(item):
    if not _started:
        _started.append(item.nodeid)
        _set_priority(item)


@pytest.fixture
def on_priority_worker(request) -> bool:
    """The test runs in the priority group (at the normal CPU priority, when on xdist)."""
    return _scope_of(request.node.nodeid) == PRIORITY_GROUP


@pytest.fixture
def broker():
    """A fresh in-process broker per test, on an ephemeral port."""
    with ThreadedBroker() as tb:
        yield tb


@pytest.fixture
def pika_conn(broker):
    conn = pika_connect(broker.port)
    yield conn
    if conn.is_open:
        conn.close()


@pytest.fixture
def channel(pika_conn):
    return pika_conn.channel()


@pytest.fixture
def connect(broker):
    """connect(vhost="/", **params) -> a new pika connection to ``broker`` (see
    eb_support.pika_connect); all are closed at teardown."""
    opened = []

    def _connect(vhost: str = "/", **params):
        conn = pika_connect(broker.port, vhost=vhost, **params)
        opened.append(conn)
        return conn

    yield _connect
    close_quietly(*opened)


# -- subprocess brokers and throwaway databases ------------------------------------------------------

@pytest.fixture
def workdir() -> Iterator[Path]:
    """A private temp dir (port files, logs, SQLite stores), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="eb-test-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def spawn_broker(workdir) -> Iterator[Callable[..., SubprocessBroker]]:
    """spawn_broker(*args, env=None) -> a running SubprocessBroker with its files in ``workdir``.

    One at a time (they share a store); all are killed at teardown and their logs printed, which
    pytest shows when the test failed."""
    started: list[SubprocessBroker] = []

    def spawn(*args: str, env: dict | None = None) -> SubprocessBroker:
        for p in started:
            assert not p.alive(), "a broker is still running on this store"
        p = SubprocessBroker(workdir, args, env=env)
        started.append(p)
        return p.start()

    try:
        yield spawn
    finally:
        for p in started:
            p.kill()
        for p in started:
            print(f"----- {p.log_path.name} (exit {p.proc.returncode if p.proc else None}) -----")
            print(p.log()[-6000:])


@pytest.fixture
def pg_database() -> Iterator[tuple[str, str]]:
    """(name, url) of a fresh, empty PostgreSQL database, dropped WITH (FORCE) afterwards; skips
    the test when PostgreSQL is unreachable."""
    name, url = create_pg_database()
    try:
        yield name, url
    finally:
        drop_pg_database(name)


@pytest.fixture(scope="session", autouse=True)
def _dispose_pg_admin() -> Iterator[None]:
    yield
    dispose_pg_admin()

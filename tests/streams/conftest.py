"""Stream queue fixtures: the in-memory ThreadedBroker (``broker``, from tests/conftest.py) for
protocol behaviour, and ``broker_process`` (real subprocesses on one SQLite store) for durability."""

from __future__ import annotations

import pytest


@pytest.fixture
def conn(connect):
    """A pika connection to the in-process broker (closed at teardown)."""
    return connect(blocked_connection_timeout=60, socket_timeout=10)


@pytest.fixture
def broker_process(spawn_broker, workdir):
    """``start(**env)`` -> a running subprocess broker on this test's SQLite store
    (``workdir/db``, the same across restarts); everything still running is killed at teardown."""
    def start(**env: str):
        return spawn_broker("--data-dir", str(workdir / "db"), env=env)
    return start

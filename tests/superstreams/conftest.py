"""Super stream fixtures: the in-memory ThreadedBroker (``broker``, tests/conftest.py) and
``broker_process`` (real subprocesses on one SQLite store) for restarts."""

from __future__ import annotations

import pytest


@pytest.fixture
def broker_process(spawn_broker, workdir):
    """``start(**env)`` -> a running subprocess broker on this test's SQLite store."""
    def start(**env: str):
        return spawn_broker("--data-dir", str(workdir / "db"), env=env)
    return start

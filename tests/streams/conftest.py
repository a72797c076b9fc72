"""Stream queue fixtures: the in-memory ThreadedBroker (``broker``, from tests/conftest.py) for
protocol behaviour, and ``broker_process`` (real subprocesses on one SQLite store) for durability."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from stream_helpers import BrokerProcess, connect


@pytest.fixture
def conn(broker):
    c = connect(broker.port)
    yield c
    if c.is_open:
        c.close()


@pytest.fixture
def broker_process():
    """``start(**env)`` -> a running subprocess broker on this test's data dir (the same across
    restarts); everything still running is killed at teardown."""
    data = Path(tempfile.mkdtemp(prefix="eb-streams-"))
    started: list[BrokerProcess] = []

    def start(**env: str) -> BrokerProcess:
        for p in started:
            assert p.proc is None or p.proc.poll() is not None, "a broker is still running"
        p = BrokerProcess(data, env)
        started.append(p)
        return p.start()

    try:
        yield start
    finally:
        for p in started:
            p.kill()
        if started:
            print(started[-1].log()[-4000:])
        shutil.rmtree(data, ignore_errors=True)

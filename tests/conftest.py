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

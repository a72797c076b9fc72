"""Durability fixtures: the real `exchange-broker serve` as a subprocess on a real store.

Every test that uses ``backend`` runs once on SQLite (a file in its own temp dir) and once on
a throwaway PostgreSQL database (``pg_database`` from tests/conftest.py: created per test,
dropped WITH (FORCE) afterwards). ``broker_factory`` starts broker processes
(eb_support.SubprocessBroker) on that store (the same store across restarts) and kills whatever
is still running at teardown.  Broker stderr (its log) goes to a file so tests can assert on log
lines without a pipe ever filling up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest
from sqlalchemy import create_engine, func, select
from sqlalchemy.engine import Engine

from eb_support import SubprocessBroker
from persistence.models import messages, queues


@dataclass
class Backend:
    """One durable store: how to point the CLI at it, and SQL access for assertions."""

    name: str
    url: str
    args: list[str]
    dbname: str | None = None  # PostgreSQL database name
    _engine: Engine | None = field(default=None, repr=False)

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = create_engine(self.url, pool_pre_ping=True)
        return self._engine

    def dispose(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def message_rows(self, queue: str | None = None, vhost: str = "/") -> int:
        """Rows in the ``messages`` table (of one queue, when named)."""
        stmt = select(func.count()).select_from(messages)
        if queue is not None:
            qid = select(queues.c.id).where(queues.c.vhost == vhost, queues.c.name == queue)
            stmt = stmt.where(messages.c.queue_id.in_(qid.scalar_subquery()))
        with self.engine.connect() as conn:
            return int(conn.execute(stmt).scalar_one())

    def stored_bodies(self, queue: str, vhost: str = "/") -> list[bytes]:
        qid = select(queues.c.id).where(queues.c.vhost == vhost, queues.c.name == queue)
        stmt = (select(messages.c.body).where(messages.c.queue_id.in_(qid.scalar_subquery()))
                .order_by(messages.c.seq))
        with self.engine.connect() as conn:
            return [bytes(r[0]) for r in conn.execute(stmt)]


def _sqlite_backend(workdir: Path) -> Backend:
    data = workdir / "data"
    data.mkdir()
    return Backend("sqlite", f"sqlite:///{data / 'broker.db'}", ["--data-dir", str(data)])


def _make_backend(kind: str, request, workdir: Path) -> Backend:
    if kind == "sqlite":
        return _sqlite_backend(workdir)
    name, url = request.getfixturevalue("pg_database")
    return Backend("postgresql", url, ["--database-url", url], dbname=name)


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request, workdir) -> Iterator[Backend]:
    """Each test using this runs on SQLite and on PostgreSQL."""
    b = _make_backend(request.param, request, workdir)
    try:
        yield b
    finally:
        b.dispose()


@pytest.fixture
def pg_backend(request, workdir) -> Iterator[Backend]:
    """PostgreSQL only (for outage tests)."""
    b = _make_backend("postgresql", request, workdir)
    try:
        yield b
    finally:
        b.dispose()


BrokerFactory = Callable[..., SubprocessBroker]


@pytest.fixture
def broker_factory(backend: Backend, spawn_broker) -> BrokerFactory:
    """``start(*extra_args)`` -> a running broker on this test's store; all killed at teardown."""
    return lambda *extra_args: spawn_broker(*backend.args, *extra_args)


@pytest.fixture
def pg_broker_factory(pg_backend: Backend, spawn_broker) -> BrokerFactory:
    return lambda *extra_args: spawn_broker(*pg_backend.args, *extra_args)

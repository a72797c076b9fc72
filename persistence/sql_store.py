"""SQLAlchemy (Core) implementation of :class:`persistence.store.Store` for SQLite and PostgreSQL.

This module holds the engine and transaction plumbing; the operations live by concern in
``sql_definitions.py`` (vhosts, users, permissions, exchanges, queues, bindings),
``sql_messages.py`` (queue messages and stream offsets), ``sql_stream_log.py`` (stream logs) and ``delayed_store.py``
(the delayed-message exchange's rows), mixed into :class:`SqlStore`.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, make_url

from . import migrate
from .database_url import parse
from .delayed_store import SqlDelayed
from .sql_definitions import SqlDefinitions
from .sql_messages import SqlMessages
from .sql_stream_log import SqlStreamLog

SQLITE_SYNC_MODES = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})


def _make_engine(url: str, sqlite_synchronous: str) -> Engine:
    database = parse(url)
    if database.is_postgres:
        # pre-ping: after a server restart (or a failover) the pool reconnects instead of failing once more
        return database.engine(pool_pre_ping=True)
    sync = sqlite_synchronous
    engine = create_engine(make_url(url), connect_args={"timeout": 30.0, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # SQLAlchemy, not the sqlite3 module, emits BEGIN (see _on_begin)
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA synchronous={sync}")
            cur.execute("PRAGMA foreign_keys=ON")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


class SqlStore(SqlDefinitions, SqlMessages, SqlStreamLog, SqlDelayed):
    """Durable store on SQLite (``sqlite:///path/broker.db``) or PostgreSQL (``postgresql+psycopg://``)."""

    def __init__(self, url: str, *, sqlite_synchronous: str = "FULL") -> None:
        self.url = url
        self._engine: Engine | None = None
        self.schema_revision: str | None = None  # the alembic revision, once open
        # called first in every write transaction (a cluster node's lease check): raising aborts it
        self.write_fence: Callable[[Connection], None] | None = None
        # called last in every write transaction made inside ``definition_write`` (a cluster node:
        # bump the definitions version and NOTIFY the other nodes, committed with the change)
        self.after_write: Callable[[Connection], None] | None = None
        self._defining = threading.local()
        self._dialect = parse(url).backend
        if self._dialect not in ("sqlite", "postgresql"):
            raise ValueError(f"unsupported database backend {self._dialect!r} (sqlite or postgresql)")
        self._sqlite_synchronous = sqlite_synchronous.upper()
        if self._sqlite_synchronous not in SQLITE_SYNC_MODES:
            raise ValueError(f"sqlite_synchronous must be one of {sorted(SQLITE_SYNC_MODES)}")

    # ---------------------------------------------------------------- plumbing
    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise RuntimeError("store is not open")
        return self._engine

    def open(self, migrate_schema: bool = True) -> None:
        """Connect and bring the schema to the newest revision (``migrate_schema=False``: only
        connect, for a reader that must not change the schema, e.g. a cluster standby)."""
        if self._engine is None:
            self._engine = _make_engine(self.url, self._sqlite_synchronous)
        if not migrate_schema:
            return
        with self._write() as conn:
            if not migrate.is_at_head(conn):  # (alembic is imported only to migrate)
                migrate.upgrade_connection(conn, "head")
            self.schema_revision = ",".join(sorted(migrate.stored_revisions(conn))) or None

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        """A write transaction: BEGIN IMMEDIATE on SQLite; rolled back on any error."""
        with self.engine.connect() as conn:
            conn.execution_options(sqlite_begin="IMMEDIATE")
            with conn.begin():
                if self.write_fence is not None:
                    self.write_fence(conn)
                yield conn
                if self.after_write is not None and getattr(self._defining, "on", False):
                    self.after_write(conn)

    def definition_write(self, fn: Callable[["SqlStore"], Any]) -> Any:
        """``fn(self)``, whose write transactions change definitions: each also runs
        ``after_write`` (when set) before it commits."""
        self._defining.on = True
        try:
            return fn(self)
        finally:
            self._defining.on = False

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            with conn.begin():
                yield conn

    def _insert(self, table: Any) -> Any:
        mod = sqlite if self._dialect == "sqlite" else postgresql
        return mod.insert(table)

    def _upsert(self, conn: Connection, table: Any, keys: list[str], values: dict) -> None:
        stmt = self._insert(table).values(**values)
        update_cols = {k: stmt.excluded[k] for k in values if k not in keys}
        if update_cols:
            stmt = stmt.on_conflict_do_update(index_elements=keys, set_=update_cols)
        else:
            stmt = stmt.on_conflict_do_nothing(index_elements=keys)
        conn.execute(stmt)

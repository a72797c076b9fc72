"""One broker per store: an exclusive lock a broker holds on its store for as long as it runs.

* SQLite: an OS file lock (``flock``) on ``<database file>.lock`` next to the database, the
  holder's pid, host and start time written in it. The kernel releases the lock when the process
  ends, however it ends (a SIGKILLed broker's store can be opened again at once).
* PostgreSQL: a session-level advisory lock held on a dedicated connection whose
  ``application_name`` names the holder (pid and host); the server releases it when that
  connection ends (the broker exits or dies, or the server drops the session).

:func:`store_lock` returns the lock of a URL (None for an in-memory SQLite store);
``acquire()`` raises :class:`StoreInUse`, whose message is one line naming the holder.
``check()`` (called now and then by the application) notices a lock that was lost, e.g. the
PostgreSQL session was terminated in an outage, takes it again when it can and reports changes.
"""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time

from sqlalchemy import pool, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import SQLAlchemyError

from .database_url import parse

log = logging.getLogger("exchange_broker.store")

APP_NAME = "exchange-broker"
# pg_try_advisory_lock(int4, int4): the pair that says "this database is an exchange-broker store"
PG_LOCK_CLASS = int.from_bytes(b"ExBr", "big")
PG_LOCK_OBJECT = 1


class StoreInUse(Exception):
    """Another process holds the store's lock; the message (one line) names it."""


def _now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def describe_holder(pid, host, since) -> str:
    """'pid 123 on host h since 2026-01-02T03:04:05Z', leaving out what is unknown."""
    parts = [f"pid {pid}" if pid else "an unknown process"]
    if host:
        parts.append(f"on host {host}")
    if since:
        parts.append(f"since {since}")
    return " ".join(parts)


class StoreLock:
    """The interface: acquire once, check now and then, release at the end."""

    where = ""

    def acquire(self) -> None:
        raise NotImplementedError

    def check(self) -> None:
        """Notice a lost lock and take it again when possible (logs what happened)."""

    def release(self) -> None:
        raise NotImplementedError


class FileLock(StoreLock):
    """``flock`` on a file next to an SQLite database."""

    def __init__(self, database_path: str) -> None:
        self.database = os.path.abspath(database_path)
        self.path = self.database + ".lock"
        self.where = self.database
        self._fd: int | None = None
        self._lost = False
        self._mutex = threading.Lock()  # check() runs in a worker thread; release() may come meanwhile

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # OSError (e.g. EACCES) names the path
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise StoreInUse(f"the store {self.database} is in use by another exchange-broker "
                             f"({self._holder()}); stop it first") from None
        info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": _now_utc()})
        os.ftruncate(fd, 0)
        os.pwrite(fd, (info + "\n").encode(), 0)
        self._fd = fd

    def _holder(self) -> str:
        """Who holds the lock, from what it wrote in the file (it writes just after locking)."""
        deadline = time.monotonic() + 1.0
        while True:
            try:
                with open(self.path, encoding="utf-8", errors="replace") as fh:
                    info = json.loads(fh.read() or "null")
            except (OSError, ValueError):
                info = None
            if isinstance(info, dict) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        info = info if isinstance(info, dict) else {}
        return describe_holder(info.get("pid"), info.get("host"), info.get("since"))

    def check(self) -> None:
        """The lock file removed or replaced under a running broker: say so (another broker
        could then lock the new file)."""
        with self._mutex:
            if self._fd is not None:
                self._check()

    def _check(self) -> None:
        try:
            same = os.path.samestat(os.fstat(self._fd), os.stat(self.path))
        except OSError:
            same = False
        if not same and not self._lost:
            log.error("the lock file %s was removed or replaced: another broker could open this store",
                      self.path)
        self._lost = not same

    def release(self) -> None:
        with self._mutex:
            if self._fd is not None:
                self._release()

    def _release(self) -> None:
        fd, self._fd = self._fd, None
        try:
            if not self._lost:
                os.ftruncate(fd, 0)  # no stale holder is named once we are gone
        finally:
            os.close(fd)  # closing the last descriptor releases the flock


class PostgresLock(StoreLock):
    """A session-level advisory lock on a connection of its own, held for the broker's life."""

    def __init__(self, url: str) -> None:
        database = parse(url)
        self.where = database.display()
        # (an unreachable host fails, not hangs: the URL's connect_timeout, else database_url's default)
        connect_args = {"application_name": f"{APP_NAME} {os.getpid()}@{socket.gethostname()}"[:63]}
        self._engine: Engine = database.engine(poolclass=pool.NullPool, isolation_level="AUTOCOMMIT",
                                               connect_args=connect_args)
        self._conn: Connection | None = None
        self._active = False  # between acquire() and release()
        self._state = "held"  # or "lost" (our session ended), "taken" (someone else holds it now)
        self._mutex = threading.Lock()  # check() runs in a worker thread; release() may come meanwhile

    @property
    def state(self) -> str:
        """"held", "lost" (our session ended) or "taken" (another process holds the lock now)."""
        return self._state

    def acquire(self) -> None:
        """Raises StoreInUse, or SQLAlchemyError when the database cannot be reached."""
        conn = self._engine.connect()
        try:
            got = conn.execute(text("SELECT pg_try_advisory_lock(:c, :o)"),
                               {"c": PG_LOCK_CLASS, "o": PG_LOCK_OBJECT}).scalar()
            if not got:
                raise StoreInUse(f"the store {self.where} is in use by another exchange-broker "
                                 f"({self._holder(conn)}); stop it first")
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._active = True

    @staticmethod
    def _holder(conn: Connection) -> str:
        row = conn.execute(text(
            "SELECT a.application_name, a.backend_start, a.client_addr FROM pg_locks l "
            "LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = :c AND l.objid = :o "
            "AND l.objsubid = 2 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"),
            {"c": PG_LOCK_CLASS, "o": PG_LOCK_OBJECT}).first()
        pid = host = since = None
        if row is not None:
            app_name, started, client = row
            prefix = APP_NAME + " "
            if app_name and app_name.startswith(prefix):
                pid, _, host = app_name[len(prefix):].partition("@")
            host = host or (str(client) if client else None)
            if started is not None:
                since = started.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return describe_holder(pid, host, since)

    def check(self) -> None:
        """The lock's session gone (a database outage, a terminated backend): take it again."""
        with self._mutex:
            if self._active:
                self._check()

    def _check(self) -> None:
        if self._conn is not None:
            try:
                self._conn.execute(text("SELECT 1"))
                return
            except SQLAlchemyError:
                self._drop_connection()
                self._state = "lost"
                log.warning("the store lock's database session ended; taking the lock again as soon as "
                            "the database answers")
        try:
            self.acquire()
        except StoreInUse as exc:
            if self._state != "taken":
                log.error("another broker took the store while this one had lost its lock: %s", exc)
            self._state = "taken"
            return
        except SQLAlchemyError:
            return  # still unreachable: the next check tries again
        log.info("the store lock is held again")
        self._state = "held"

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.invalidate()
                conn.close()
            except SQLAlchemyError:
                pass

    def release(self) -> None:
        with self._mutex:
            self._active = False
            if self._conn is not None:
                try:
                    self._conn.close()  # the session ends: the server releases the advisory lock
                except SQLAlchemyError:
                    pass
                self._conn = None
            self._engine.dispose()


def store_lock(url: str) -> StoreLock | None:
    """The lock of the store at ``url`` (None when it needs none: an in-memory SQLite database)."""
    backend = parse(url).backend
    if backend == "postgresql":
        return PostgresLock(url)
    if backend == "sqlite":
        parsed = make_url(url)
        database = parsed.database or ""
        if database in ("", ":memory:") or database.startswith("file:"):
            return None
        return FileLock(database)
    raise ValueError(f"unsupported database backend {backend!r} (sqlite or postgresql)")

"""Messages in the SQL store: queue rows (group-commit batches, paging reads, the stream logs'
chunks written in the same transactions) and stream consumer offsets.

A mixin of :class:`persistence.sql_store.SqlStore` (which provides ``_write``, ``_read``,
``_upsert`` and ``_dialect``); one transaction per call.
"""

from __future__ import annotations

import threading
from itertools import chain
from typing import Iterable

from sqlalchemy import BigInteger, any_, bindparam, delete, event, func, insert, select, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from .models import messages, queues, stream_offsets
from .store import StoredMessage

REMOVE_CHUNK = 500  # seqs per "seq IN (...)" DELETE
IN_LIST_MIN = 4  # a queue with fewer removes in a batch goes through the executemany DELETE

_MESSAGE_COLUMNS = (
    "queue_id", "seq", "exchange", "routing_key", "properties", "body",
    "created_ms", "expires_ms", "priority",
)
_COPY_MESSAGES = f"COPY messages ({', '.join(_MESSAGE_COLUMNS)}) FROM STDIN"
_SQLITE_INSERT = (
    f"INSERT INTO messages ({', '.join(_MESSAGE_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(_MESSAGE_COLUMNS))})"
)
# SQLite: rows per multi-row INSERT. The sqlite3 module releases the GIL around every
# sqlite3_step, i.e. once per row of an executemany: with the event loop busy on the other
# thread each row then waits to get the GIL back, which made a commit of 512 appends take ~3x
# its CPU time. One statement of SQLITE_ROWS rows steps once (9 x 256 = 2,304 parameters, far
# below SQLite's limit of 32,766); the remainder goes in steps of SQLITE_ROWS_SMALL, then singly.
SQLITE_ROWS = 256
SQLITE_ROWS_SMALL = 32
_SQLITE_VALUES = f"({', '.join('?' * len(_MESSAGE_COLUMNS))})"
_SQLITE_INSERT_MANY = {
    n: f"INSERT INTO messages ({', '.join(_MESSAGE_COLUMNS)}) VALUES "
    + ", ".join([_SQLITE_VALUES] * n)
    for n in (SQLITE_ROWS, SQLITE_ROWS_SMALL)
}
_DELETE_SEQS = delete(messages).where(
    messages.c.queue_id == bindparam("q"), messages.c.seq.in_(bindparam("seqs", expanding=True))
)
# PostgreSQL: "seq = ANY(array)", one statement text whatever the count (an expanding IN list is a
# new text, so a new parse by the driver and the server, for every count a batch happens to have)
_DELETE_SEQS_ARRAY = delete(messages).where(
    messages.c.queue_id == bindparam("q"), messages.c.seq == any_(bindparam("seqs", type_=ARRAY(BigInteger)))
)
_DELETE_MESSAGE = delete(messages).where(
    messages.c.queue_id == bindparam("q"), messages.c.seq == bindparam("s")
)
_DELETE_RANGE = delete(messages).where(
    messages.c.queue_id == bindparam("q"), messages.c.seq.between(bindparam("lo"), bindparam("hi"))
)
RANGES_MAX = 8  # more runs of consecutive seqs than this in one batch's removes: an IN list instead


def _runs(seqs: list[int]) -> list[tuple[int, int]] | None:
    """``seqs`` (one queue's removes) as runs of consecutive seqs [(first, last), ...], each
    holding every seq between its ends; None when they make more than RANGES_MAX runs. (A
    SQLAlchemy expanding IN list costs a few microseconds of Python per seq.)"""
    seqs = sorted(set(seqs))
    if seqs[-1] - seqs[0] + 1 == len(seqs):
        return [(seqs[0], seqs[-1])]
    runs = []
    first = prev = seqs[0]
    for s in seqs[1:]:
        if s != prev + 1:
            runs.append((first, prev))
            if len(runs) >= RANGES_MAX:
                return None
            first = s
        prev = s
    runs.append((first, prev))
    return runs


_RAISE_MARK = (
    update(queues)
    .where(queues.c.id == bindparam("q"), queues.c.delivered_mark < bindparam("m"))
    .values(delivered_mark=bindparam("m"))
)


def _copy_rows(conn: Connection, rows: list[tuple]) -> None:
    """Bulk-load message rows with psycopg's COPY, reporting errors as SQLAlchemy exceptions."""
    dbapi_conn = conn.connection.driver_connection
    try:
        with dbapi_conn.cursor() as cur, cur.copy(_COPY_MESSAGES) as copy:
            for row in rows:
                copy.write_row(row)
    except conn.dialect.loaded_dbapi.Error as exc:
        raise DBAPIError.instance(
            _COPY_MESSAGES, None, exc, conn.dialect.loaded_dbapi.Error,
            dialect=conn.dialect,
        ) from exc


def _sqlite_insert(conn: Connection, rows: list[tuple]) -> None:
    """Message rows straight to the driver (no per-row bind processing), in multi-row INSERTs of
    SQLITE_ROWS, then SQLITE_ROWS_SMALL rows (see SQLITE_ROWS), the last few one by one; errors
    are reported as SQLAlchemy exceptions (IntegrityError ...), as conn.execute would."""
    dbapi = conn.dialect.loaded_dbapi
    cur = conn.connection.driver_connection.cursor()
    try:
        i = 0
        n = len(rows)
        for size in (SQLITE_ROWS, SQLITE_ROWS_SMALL):
            whole = i + (n - i) // size * size
            if whole > i:
                flat = list(chain.from_iterable(rows[i:whole]))
                step = size * len(_MESSAGE_COLUMNS)
                cur.executemany(_SQLITE_INSERT_MANY[size],
                                [flat[j:j + step] for j in range(0, len(flat), step)])
                i = whole
        if i < n:
            cur.executemany(_SQLITE_INSERT, rows[i:])
    except dbapi.Error as exc:
        raise DBAPIError.instance(_SQLITE_INSERT, None, exc, dbapi.Error,
                                  dialect=conn.dialect) from exc
    finally:
        cur.close()


# -- commits without fsync (write_batch(sync=False): stream appends) --------------------------------
# SQLite refuses to change PRAGMA synchronous inside a transaction, so the level a write transaction
# commits with is set when its connection is taken from the engine, before its BEGIN (an
# "engine_connect" listener); the level each pooled connection is at is kept in its info dict.
# In WAL mode NORMAL writes the commit to the WAL (the OS has it: a process crash loses nothing)
# without fsyncing it; the next fsynced commit or checkpoint makes it durable on disk too.
_UNSYNCED_LEVEL = "NORMAL"
_FSYNCING_LEVELS = ("FULL", "EXTRA")
_commit = threading.local()  # .unsynced: the write transaction about to begin need not fsync


def _hook_sqlite_levels(engine, level: str) -> None:
    def on_connect(conn: Connection) -> None:
        want = _UNSYNCED_LEVEL if getattr(_commit, "unsynced", False) else level
        info = conn.connection.info
        if info.get("eb_synchronous", level) != want:
            conn.connection.driver_connection.execute(f"PRAGMA synchronous={want}")
        info["eb_synchronous"] = want

    event.listen(engine, "engine_connect", on_connect)


class SqlMessages:
    """Message, stream-log and offset reads and writes (mixed into :class:`SqlStore`)."""

    _levels_hooked = None  # the engine whose listener sets the commits' synchronous level

    # ---------------------------------------------------------------- messages
    def write_batch(
        self,
        appends: list[StoredMessage],
        removes: list[tuple[int, int]],
        delivered_marks: dict[int, int],
        purges: Iterable[int] = (),
        sync: bool = True,
        logs: dict[int, list] | None = None,
    ) -> None:
        """``logs``: {stream queue id: consecutive messages to append to its log} (objects with
        seq, exchange, routing_key, properties, body, created_ms), stored as chunks."""
        purge_ids = list(purges)
        if not (appends or removes or delivered_marks or purge_ids or logs):
            return
        if sync or self._dialect != "sqlite" or self._sqlite_synchronous not in _FSYNCING_LEVELS:
            self._write_batch(appends, removes, delivered_marks, purge_ids, sync, logs)
            return
        engine = self.engine
        if self._levels_hooked is not engine:
            _hook_sqlite_levels(engine, self._sqlite_synchronous)
            self._levels_hooked = engine
        _commit.unsynced = True
        try:
            self._write_batch(appends, removes, delivered_marks, purge_ids, sync, logs)
        finally:
            _commit.unsynced = False

    def _write_batch(self, appends, removes, delivered_marks, purge_ids, sync: bool, logs) -> None:
        with self._write() as conn:
            if not sync and self._dialect == "postgresql":
                # the commit returns before the server flushes its WAL (the server has it: a crash
                # of this process loses nothing; a crash of the server may lose the last ones)
                conn.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")
            if purge_ids:
                conn.execute(delete(messages).where(messages.c.queue_id.in_(purge_ids)))
            if appends:
                self._insert_messages(conn, appends)
            if logs:
                self._insert_chunks(conn, logs)
            if removes:
                self._delete_messages(conn, removes)
            if delivered_marks:
                conn.execute(_RAISE_MARK, [{"q": q, "m": m} for q, m in delivered_marks.items()])

    def _insert_messages(self, conn: Connection, appends: list[StoredMessage]) -> None:
        rows = [
            (
                m.queue_id, m.seq, m.exchange, m.routing_key, m.properties, m.body,
                m.created_ms, m.expires_ms, m.priority,
            )
            for m in appends
        ]
        if conn.dialect.driver == "psycopg":
            _copy_rows(conn, rows)  # COPY is ~2x faster than a pipelined executemany
        elif conn.dialect.name == "sqlite":
            _sqlite_insert(conn, rows)
        else:
            conn.execute(insert(messages), [dict(zip(_MESSAGE_COLUMNS, r)) for r in rows])

    def _delete_messages(self, conn: Connection, removes: list[tuple[int, int]]) -> None:
        by_queue: dict[int, list[int]] = {}
        for q, s in removes:
            by_queue.setdefault(q, []).append(s)
        singles: list[dict[str, int]] = []
        ranges: list[dict[str, int]] = []
        for q, seqs in by_queue.items():
            if len(seqs) < IN_LIST_MIN:
                singles.extend({"q": q, "s": s} for s in seqs)
                continue
            runs = _runs(seqs)
            if runs is not None:  # acks come in runs (multiple): a range scan each, no IN list
                ranges.extend({"q": q, "lo": lo, "hi": hi} for lo, hi in runs)
                continue
            # scattered seqs: on PostgreSQL one statement text whatever their count (= ANY(array))
            statement = _DELETE_SEQS_ARRAY if self._dialect == "postgresql" else _DELETE_SEQS
            for i in range(0, len(seqs), REMOVE_CHUNK):  # one indexed range scan per chunk
                conn.execute(statement, {"q": q, "seqs": seqs[i : i + REMOVE_CHUNK]})
        if ranges:
            conn.execute(_DELETE_RANGE, ranges)
        if singles:
            conn.execute(_DELETE_MESSAGE, singles)

    def load_messages(self, queue_id: int, after_seq: int, limit: int) -> list[StoredMessage]:
        m = messages.c
        with self._read() as conn:
            mark = conn.scalar(select(queues.c.delivered_mark).where(queues.c.id == queue_id)) or 0
            rows = conn.execute(
                select(
                    m.seq, m.exchange, m.routing_key, m.properties, m.body,
                    m.created_ms, m.expires_ms, m.priority,
                )
                .where(m.queue_id == queue_id, m.seq > after_seq)
                .order_by(m.seq)
                .limit(limit)
            ).all()
        return [
            StoredMessage(
                queue_id, seq, exchange, routing_key, bytes(props), bytes(body),
                created_ms, expires_ms, priority, seq <= mark,
            )
            for seq, exchange, routing_key, props, body, created_ms, expires_ms, priority in rows
        ]

    def queue_stats(self, queue_id: int) -> tuple[int, int, int]:
        m = messages.c
        with self._read() as conn:
            count, size, max_seq = conn.execute(
                select(
                    func.count(),
                    func.coalesce(func.sum(func.length(m.body)), 0),
                    func.coalesce(func.max(m.seq), 0),
                ).where(m.queue_id == queue_id)
            ).one()
        return int(count), int(size), int(max_seq)

    # ---------------------------------------------------------- stream offsets
    def store_offset(self, vhost: str, queue: str, name: str, offset: int) -> None:
        with self._write() as conn:
            self._upsert(
                conn,
                stream_offsets,
                ["vhost", "queue", "name"],
                {"vhost": vhost, "queue": queue, "name": name, "offset": int(offset)},
            )

    def query_offset(self, vhost: str, queue: str, name: str) -> int | None:
        o = stream_offsets.c
        with self._read() as conn:
            val = conn.scalar(
                select(o.offset).where(o.vhost == vhost, o.queue == queue, o.name == name)
            )
        return None if val is None else int(val)

    def load_offsets(self, vhost: str, queue: str) -> dict[str, int]:
        """Every stored consumer offset of one stream: {name: offset}."""
        o = stream_offsets.c
        with self._read() as conn:
            rows = conn.execute(
                select(o.name, o.offset).where(o.vhost == vhost, o.queue == queue)
            ).all()
        return {name: int(off) for name, off in rows}
